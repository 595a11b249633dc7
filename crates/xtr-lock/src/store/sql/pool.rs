//! The store's pool: built on first use (inside the runtime that uses it), built again after
//! `close`; or the pool the user gave, used as it is.

use std::sync::Mutex;

use crate::mutex::lock;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;

use super::config::{SqlConfig, Target};
use super::dialect::Flavor;
use super::queries::Pool;

#[derive(Debug)]
pub(crate) struct Pools {
    /// How to build the store's own pool; `None` for a pool the user gave.
    config: Option<SqlConfig>,
    current: Mutex<Option<Pool>>,
    flavor: Flavor,
}

impl Clone for Pools {
    fn clone(&self) -> Self {
        Pools {
            config: self.config.clone(),
            current: Mutex::new(if self.config.is_some() {
                // A store made from another gets its own pool (its own connections).
                None
            } else {
                self.lock().clone()
            }),
            flavor: self.flavor,
        }
    }
}

impl Pools {
    pub(crate) fn from_config(config: &SqlConfig) -> Pools {
        let flavor = match &config.target {
            Target::Postgres(_) => Flavor::Postgres,
            Target::MySql(_) => Flavor::MySql,
            Target::Sqlite { .. } => Flavor::Sqlite,
        };
        Pools {
            config: Some(config.clone()),
            current: Mutex::new(None),
            flavor,
        }
    }

    pub(crate) fn given(pool: Pool) -> Pools {
        Pools {
            config: None,
            flavor: pool.flavor(),
            current: Mutex::new(Some(pool)),
        }
    }

    pub(crate) fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// Whether the store names an SQLite file that does not exist. Only a save may make it:
    /// a release or a read of a lock there finds nothing to do, and must not leave an empty
    /// file behind (a key someone edited could name any path).
    pub(crate) fn file_missing(&self) -> bool {
        match self.config.as_ref().map(|c| &c.target) {
            Some(Target::Sqlite {
                options,
                memory: false,
            }) => !options.get_filename().exists(),
            _ => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Pool>> {
        lock(&self.current)
    }

    /// The pool, built now if needed (lazily: no connection is opened here).
    pub(crate) fn get(&self) -> Result<Pool, sqlx::Error> {
        let mut current = self.lock();
        if let Some(pool) = &*current {
            return Ok(pool.clone());
        }
        let Some(config) = &self.config else {
            return Err(sqlx::Error::PoolClosed);
        };
        let pool = build(config);
        *current = Some(pool.clone());
        Ok(pool)
    }

    /// Closes the store's own pool, waiting at most `bound` for connections still in use; a
    /// given pool stays open (it is the user's).
    pub(crate) async fn close(&self, bound: std::time::Duration) {
        if self.config.is_none() {
            return;
        }
        let pool = self.lock().take();
        if let Some(pool) = pool {
            pool.close_within(bound).await;
        }
    }
}

/// The store's own pool. Connections are not pinged before each use (a round trip per
/// statement); a broken one is replaced when its statement fails (see `ops::run`).
fn build(config: &SqlConfig) -> Pool {
    let n = config.max_connections;
    let wait = config.connect_timeout;
    match &config.target {
        Target::Postgres(o) => Pool::Postgres(
            PgPoolOptions::new()
                .max_connections(n)
                .acquire_timeout(wait)
                .test_before_acquire(false)
                .connect_lazy_with(o.clone()),
        ),
        Target::MySql(o) => Pool::MySql(
            MySqlPoolOptions::new()
                .max_connections(n)
                .acquire_timeout(wait)
                .test_before_acquire(false)
                .connect_lazy_with(o.clone()),
        ),
        Target::Sqlite { options, memory } => {
            let mut opts = SqlitePoolOptions::new()
                .max_connections(n)
                .acquire_timeout(wait)
                .test_before_acquire(false);
            if *memory {
                // The database lives as long as its one connection.
                opts = opts.idle_timeout(None).max_lifetime(None);
            }
            Pool::Sqlite(opts.connect_lazy_with(options.clone()))
        }
    }
}

/// A credential-free description of a PostgreSQL pool's server.
pub(super) fn describe_pg(pool: &sqlx::PgPool) -> String {
    let o = pool.connect_options();
    format!(
        "postgres://{}:{}/{}",
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap_or("postgres")
    )
}
