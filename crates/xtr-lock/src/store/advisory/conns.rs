//! The store's connections: idle lock connections that hold nothing, kept for the next holder,
//! and a small pool for what is not a lock (`pg_locks` queries, cancel requests).

use std::sync::Mutex;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};

use super::config::AdvisoryConfig;

/// A lock connection: a session of its own, and its backend's pid.
pub(super) struct Conn {
    pub(super) pg: PgConnection,
    pub(super) pid: i32,
    /// Taken from the idle list (it may have gone stale), not just opened.
    pub(super) reused: bool,
}

/// Why a connection could not be had.
pub(super) enum ConnectError {
    Sqlx(sqlx::Error),
    TimedOut(Duration),
}

pub(super) struct Conns {
    pub(super) config: AdvisoryConfig,
    /// Connections known to hold nothing: each came back after the unlocks of its last holder
    /// all answered, with no statement in flight.
    idle: Mutex<Vec<Conn>>,
    control: Mutex<Option<PgPool>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Conns {
    pub(super) fn new(config: AdvisoryConfig) -> Conns {
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
        let open = async {
            let mut pg = PgConnection::connect_with(&self.config.options).await?;
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut pg)
                .await?;
            Ok::<_, sqlx::Error>(Conn {
                pg,
                pid,
                reused: false,
            })
        };
        match tokio::time::timeout(timeout, open).await {
            Ok(Ok(conn)) => Ok(conn),
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

    /// The pool for `pg_locks` queries and cancel requests, built on first use.
    pub(super) fn control(&self) -> PgPool {
        lock(&self.control)
            .get_or_insert_with(|| {
                PgPoolOptions::new()
                    .max_connections(2)
                    .min_connections(0)
                    .acquire_timeout(self.config.connect_timeout)
                    .idle_timeout(Some(Duration::from_secs(60)))
                    .connect_lazy_with(self.config.options.clone())
            })
            .clone()
    }

    /// Cancels the statement running in backend `pid` (a lock wait): `pg_cancel_backend`, which
    /// needs the same role as the lock connections (or `pg_signal_backend`). Whether it
    /// arrived or not, the wait's own response decides what happened.
    pub(super) async fn cancel(&self, pid: i32) -> Result<(), String> {
        let pool = self.control();
        let ask = sqlx::query_scalar::<_, bool>("SELECT pg_cancel_backend($1)")
            .bind(pid)
            .fetch_one(&pool);
        match tokio::time::timeout(self.config.statement_timeout, ask).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the cancel request got no answer".into()),
        }
    }

    /// Closes the idle connections and the control pool. Holders keep their own.
    pub(super) async fn close(&self) {
        let idle: Vec<Conn> = std::mem::take(&mut *lock(&self.idle));
        for conn in idle {
            let _ = tokio::time::timeout(self.config.statement_timeout, conn.pg.close()).await;
        }
        let pool = lock(&self.control).take();
        if let Some(pool) = pool {
            pool.close().await;
        }
    }
}

/// Closes a connection in the background (it holds nothing).
fn close_later(conn: Conn) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.pg.close()).await;
        });
    }
}
