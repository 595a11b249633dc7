//! The store's connections: idle lock connections that hold nothing, kept for the next holder,
//! and a small pool for what is not a lock (introspection, cancel requests).

use std::sync::Mutex;
use std::time::Duration;

use crate::mutex::lock;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};

use super::config::SessionConfig;
use super::db::{DbConn, Target};
use crate::store::sql::errors::said;

/// A lock connection: a session of its own, and its id on the server (PostgreSQL's backend
/// pid, MySQL's connection id).
pub(super) struct Conn {
    pub(super) db: DbConn,
    pub(super) pid: i64,
    /// How long the server keeps this session once its client goes silent; `None`: it never
    /// ends it on its own.
    pub(super) silence: Option<Duration>,
    /// Taken from the idle list (it may have gone stale), not just opened.
    pub(super) reused: bool,
}

/// Why a connection could not be had.
pub(super) enum ConnectError {
    Sqlx(sqlx::Error),
    TimedOut(Duration),
}

/// The control pool, of either database.
#[derive(Clone)]
pub(super) enum Control {
    Postgres(PgPool),
    MySql(MySqlPool),
}

pub(super) struct Conns {
    pub(super) config: SessionConfig,
    /// Connections known to hold nothing: each came back after the unlocks of its last holder
    /// all answered, with no statement in flight.
    idle: Mutex<Vec<Conn>>,
    control: Mutex<Option<Control>>,
}

impl Conns {
    pub(super) fn new(config: SessionConfig) -> Conns {
        Conns {
            config,
            idle: Mutex::new(Vec::new()),
            control: Mutex::new(None),
        }
    }

    /// An idle connection, or a new one.
    ///
    /// # Cancel safety
    ///
    /// Dropped while connecting, the half-open connection is closed.
    pub(super) async fn get(&self) -> Result<Conn, ConnectError> {
        if let Some(mut conn) = lock(&self.idle).pop() {
            conn.reused = true;
            return Ok(conn);
        }
        self.connect().await
    }

    /// A new connection.
    ///
    /// # Cancel safety
    ///
    /// Dropped while connecting, the half-open connection is closed.
    pub(super) async fn connect(&self) -> Result<Conn, ConnectError> {
        let timeout = self.config.connect_timeout;
        match tokio::time::timeout(timeout, DbConn::connect(&self.config.target)).await {
            Ok(Ok((db, opened))) => Ok(Conn {
                db,
                pid: opened.id,
                silence: opened.silence,
                reused: false,
            }),
            Ok(Err(e)) => Err(ConnectError::Sqlx(e)),
            Err(_) => Err(ConnectError::TimedOut(timeout)),
        }
    }

    /// Takes back a connection that holds nothing (its holder's unlocks all answered true).
    pub(super) fn put_back(&self, conn: Conn) {
        let mut idle = lock(&self.idle);
        if idle.len() < self.config.max_idle {
            idle.push(conn);
        } else {
            drop(idle);
            close_later(conn);
        }
    }

    /// The pool for introspection and cancel requests, built on first use. Never used for a
    /// lock statement.
    pub(super) fn control(&self) -> Control {
        lock(&self.control)
            .get_or_insert_with(|| {
                let idle = Some(Duration::from_secs(60));
                match &self.config.target {
                    Target::Postgres(options) => Control::Postgres(
                        PgPoolOptions::new()
                            .max_connections(2)
                            .min_connections(0)
                            .acquire_timeout(self.config.connect_timeout)
                            .idle_timeout(idle)
                            .connect_lazy_with(options.clone()),
                    ),
                    Target::MySql(options) => Control::MySql(
                        MySqlPoolOptions::new()
                            .max_connections(2)
                            .min_connections(0)
                            .acquire_timeout(self.config.connect_timeout)
                            .idle_timeout(idle)
                            .connect_lazy_with(options.clone()),
                    ),
                }
            })
            .clone()
    }

    /// Cancels the statement running in session `pid` (a lock wait): PostgreSQL's
    /// `pg_cancel_backend` (the same role may always cancel its own backends), MySQL's
    /// `KILL QUERY` (a user may always kill its own statements). Whether it arrived or not, the
    /// wait's own response decides what happened.
    pub(super) async fn cancel(&self, pid: i64) -> Result<(), String> {
        let ask = async {
            match self.control() {
                Control::Postgres(pool) => sqlx::query("SELECT pg_cancel_backend($1)")
                    .bind(pid as i32)
                    .execute(&pool)
                    .await
                    .map(drop),
                Control::MySql(pool) => {
                    // A number: nothing to quote.
                    let kill = format!("KILL QUERY {pid}");
                    sqlx::query(sqlx::AssertSqlSafe(kill))
                        .execute(&pool)
                        .await
                        .map(drop)
                }
            }
        };
        match tokio::time::timeout(self.config.statement_timeout, ask).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(said(&e)),
            Err(_) => Err("the cancel request got no answer".into()),
        }
    }

    /// Closes the idle connections and the control pool. Holders keep their own.
    pub(super) async fn close(&self) {
        let idle: Vec<Conn> = std::mem::take(&mut *lock(&self.idle));
        for conn in idle {
            let _ = tokio::time::timeout(self.config.statement_timeout, conn.db.close()).await;
        }
        let pool = lock(&self.control).take();
        match pool {
            Some(Control::Postgres(pool)) => pool.close().await,
            Some(Control::MySql(pool)) => pool.close().await,
            None => {}
        }
    }
}

/// Closes a connection in the background (it holds nothing).
fn close_later(conn: Conn) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.db.close()).await;
        });
    }
}
