//! The two databases' session locks, statement by statement: PostgreSQL advisory locks on one
//! `bigint`, MySQL/MariaDB named locks (`GET_LOCK`).

use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlDatabaseError};
use sqlx::postgres::{PgConnectOptions, PgConnection};

use crate::key::Mode;
use crate::store::sql::errors::said;

/// Which database, with the driver's options.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Postgres(PgConnectOptions),
    MySql(MySqlConnectOptions),
}

/// What a resource locks: an advisory key, or a lock name.
#[derive(Debug, Clone)]
pub(crate) enum LockId {
    Advisory(i64),
    Named(String),
}

/// One session.
pub(crate) enum DbConn {
    Postgres(PgConnection),
    MySql(MySqlConnection),
}

/// A lock statement.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Try(Mode),
    Wait(Mode),
    Unlock(Mode),
}

/// PostgreSQL: one statement each, answering a boolean.
fn pg_sql(op: Op) -> &'static str {
    match op {
        Op::Try(Mode::Write) => "SELECT pg_try_advisory_lock($1)",
        Op::Try(Mode::Read) => "SELECT pg_try_advisory_lock_shared($1)",
        Op::Wait(Mode::Write) => "SELECT true FROM pg_advisory_lock($1)",
        Op::Wait(Mode::Read) => "SELECT true FROM pg_advisory_lock_shared($1)",
        Op::Unlock(Mode::Write) => "SELECT pg_advisory_unlock($1)",
        Op::Unlock(Mode::Read) => "SELECT pg_advisory_unlock_shared($1)",
    }
}

/// MySQL/MariaDB: exclusive only. A wait is a `GET_LOCK` with a year's timeout (a negative one
/// means "forever" on MySQL but not on every MariaDB); the caller's deadline cancels it.
fn my_sql(op: Op) -> &'static str {
    match op {
        Op::Try(_) => "SELECT GET_LOCK(?, 0)",
        Op::Wait(_) => "SELECT GET_LOCK(?, 31536000)",
        Op::Unlock(_) => "SELECT RELEASE_LOCK(?)",
    }
}

/// This session's holds on the key, from `pg_locks`: the database, both halves of the key and
/// the single-`bigint` form (`objsubid = 1`) together.
const PG_CHECK: &str = "SELECT coalesce(bool_or(mode = 'ExclusiveLock'), false), \
     coalesce(bool_or(mode = 'ShareLock'), false) FROM pg_locks \
     WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid() \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1";

/// PostgreSQL: the backend's pid, and the settings that end a silent client's session (as the
/// server applies them to this session: `tcp_keepalives_*` read back the socket's own values,
/// the operating system's defaults included; zero on a Unix socket).
const PG_SESSION: &str = "SELECT pg_backend_pid(), \
     (SELECT CAST(setting AS BIGINT) FROM pg_settings WHERE name = 'idle_session_timeout'), \
     (SELECT CAST(setting AS BIGINT) FROM pg_settings WHERE name = 'tcp_keepalives_idle'), \
     (SELECT CAST(setting AS BIGINT) FROM pg_settings WHERE name = 'tcp_keepalives_interval'), \
     (SELECT CAST(setting AS BIGINT) FROM pg_settings WHERE name = 'tcp_keepalives_count')";

/// How long a MySQL server's TCP keepalive takes to give up on a peer that went away: the
/// server enables it with its operating system's settings, which a client cannot read; Linux's
/// defaults (7200 s idle, then 9 probes 75 s apart) are assumed.
const MYSQL_TCP_KEEPALIVE: Duration = Duration::from_secs(7200 + 9 * 75);

/// How long the server keeps a PostgreSQL session whose client went silent: the shorter of
/// `idle_session_timeout` (milliseconds; a stopped client) and the TCP keepalive's time to give
/// up (seconds; a client cut off). `None` when neither ends it.
fn pg_silence(
    idle_ms: Option<i64>,
    idle: Option<i64>,
    interval: Option<i64>,
    count: Option<i64>,
) -> Option<Duration> {
    let positive = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).filter(|v| *v > 0);
    let timeout = positive(idle_ms).map(Duration::from_millis);
    let keepalive = match (positive(idle), positive(interval), positive(count)) {
        (Some(i), Some(v), Some(c)) => Some(Duration::from_secs(i + v * c)),
        _ => None,
    };
    timeout.into_iter().chain(keepalive).min()
}

/// A new session: its id on the server (PostgreSQL's backend pid, MySQL's connection id), and
/// how long the server keeps it once its client goes silent (see [`pg_silence`]).
pub(crate) struct Opened {
    pub(crate) id: i64,
    pub(crate) silence: Option<Duration>,
}

impl DbConn {
    pub(crate) async fn connect(target: &Target) -> Result<(DbConn, Opened), sqlx::Error> {
        use sqlx::Connection as _;
        match target {
            Target::Postgres(options) => {
                let mut pg = PgConnection::connect_with(options).await?;
                type Row = (i32, Option<i64>, Option<i64>, Option<i64>, Option<i64>);
                let (pid, idle_ms, idle, interval, count): Row =
                    sqlx::query_as(PG_SESSION).fetch_one(&mut pg).await?;
                let opened = Opened {
                    id: i64::from(pid),
                    silence: pg_silence(idle_ms, idle, interval, count),
                };
                Ok((DbConn::Postgres(pg), opened))
            }
            Target::MySql(options) => {
                let mut my = MySqlConnection::connect_with(options).await?;
                let (id, wait): (i64, i64) = sqlx::query_as(
                    "SELECT CAST(CONNECTION_ID() AS SIGNED), CAST(@@session.wait_timeout AS SIGNED)",
                )
                .fetch_one(&mut my)
                .await?;
                // `wait_timeout` ends a stopped client's idle session; the keepalive a cut-off one's.
                let wait = Duration::from_secs(u64::try_from(wait).unwrap_or(0).max(1));
                let opened = Opened {
                    id,
                    silence: Some(wait.min(MYSQL_TCP_KEEPALIVE)),
                };
                Ok((DbConn::MySql(my), opened))
            }
        }
    }

    /// Runs a lock statement. `None`: MySQL's `GET_LOCK` answered NULL (the statement was
    /// killed, or failed inside the server).
    pub(crate) async fn op(&mut self, op: Op, id: &LockId) -> Result<Option<bool>, sqlx::Error> {
        match (self, id) {
            (DbConn::Postgres(pg), LockId::Advisory(key)) => {
                sqlx::query_scalar::<_, bool>(pg_sql(op))
                    .bind(*key)
                    .fetch_one(pg)
                    .await
                    .map(Some)
            }
            (DbConn::MySql(my), LockId::Named(name)) => {
                let answer: Option<i64> = sqlx::query_scalar(my_sql(op))
                    .bind(name.as_str())
                    .fetch_one(my)
                    .await?;
                Ok(match (op, answer) {
                    // RELEASE_LOCK: NULL when no such lock exists, 0 when another holds it.
                    (Op::Unlock(_), a) => Some(a == Some(1)),
                    (_, a) => a.map(|a| a == 1),
                })
            }
            _ => Err(sqlx::Error::Protocol(
                "a lock id of the other database".into(),
            )),
        }
    }

    /// What this session holds on `id`: (write, read).
    pub(crate) async fn check(&mut self, id: &LockId) -> Result<(bool, bool), sqlx::Error> {
        match (self, id) {
            (DbConn::Postgres(pg), LockId::Advisory(key)) => {
                let (classid, objid) = super::keys::pg_locks_ids(*key);
                sqlx::query_as::<_, (bool, bool)>(PG_CHECK)
                    .bind(classid)
                    .bind(objid)
                    .fetch_one(pg)
                    .await
            }
            (DbConn::MySql(my), LockId::Named(name)) => {
                let mine: Option<i64> =
                    sqlx::query_scalar("SELECT IS_USED_LOCK(?) = CONNECTION_ID()")
                        .bind(name.as_str())
                        .fetch_one(my)
                        .await?;
                Ok((mine == Some(1), false))
            }
            _ => Err(sqlx::Error::Protocol(
                "a lock id of the other database".into(),
            )),
        }
    }

    pub(crate) async fn ping(&mut self) -> Result<(), sqlx::Error> {
        match self {
            DbConn::Postgres(pg) => sqlx::query("SELECT 1").execute(pg).await.map(drop),
            DbConn::MySql(my) => sqlx::query("SELECT 1").execute(my).await.map(drop),
        }
    }

    pub(crate) async fn close(self) {
        use sqlx::Connection as _;
        let _ = match self {
            DbConn::Postgres(pg) => pg.close().await,
            DbConn::MySql(my) => my.close().await,
        };
    }
}

/// How a lock statement failed, by what the server said.
pub(crate) enum Failure {
    /// Cancelled or killed (PostgreSQL 57014, MySQL 1317).
    Cancelled,
    /// A deadlock between session locks (PostgreSQL 40P01, MySQL 3058).
    Deadlock,
    /// The session ended or the connection broke.
    Broken(String),
    /// Another refusal; the session is fine.
    Refused(String),
}

pub(crate) fn classify(e: &sqlx::Error) -> Failure {
    match e {
        sqlx::Error::Database(d) => {
            if let Some(my) = d.try_downcast_ref::<MySqlDatabaseError>() {
                return match my.number() {
                    1317 => Failure::Cancelled,
                    3058 => Failure::Deadlock,
                    // Shutdown in progress; connection killed.
                    1053 | 1927 => Failure::Broken(my.message().to_owned()),
                    _ => Failure::Refused(my.message().to_owned()),
                };
            }
            match d.code().as_deref() {
                Some("57014") => Failure::Cancelled,
                Some("40P01") => Failure::Deadlock,
                // The server is shutting down, or an operator terminated the backend.
                Some("57P01" | "57P02" | "57P03") => Failure::Broken(d.message().to_owned()),
                _ => Failure::Refused(d.message().to_owned()),
            }
        }
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => {
            Failure::Broken(said(e))
        }
        _ => Failure::Refused(said(e)),
    }
}

/// Whether `e` means the session is gone.
pub(crate) fn is_broken(e: &sqlx::Error) -> bool {
    matches!(classify(e), Failure::Broken(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_clients_session_ends_at_the_shorter_of_its_settings() {
        let s = |v: u64| Some(Duration::from_secs(v));
        // Linux's keepalive defaults, no idle timeout.
        assert_eq!(pg_silence(Some(0), Some(7200), Some(75), Some(9)), s(7875));
        assert_eq!(
            pg_silence(Some(10_000), Some(7200), Some(75), Some(9)),
            s(10)
        );
        assert_eq!(pg_silence(None, Some(60), Some(5), Some(3)), s(75));
        // A Unix socket (keepalives read zero) and no idle timeout: never.
        assert_eq!(pg_silence(Some(0), Some(0), Some(0), Some(0)), None);
        assert_eq!(
            pg_silence(Some(2_500), Some(0), Some(0), Some(0)),
            Some(Duration::from_millis(2_500))
        );
    }
}
