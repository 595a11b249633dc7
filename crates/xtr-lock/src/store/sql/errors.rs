//! Database failures as this library's errors: which may pass (retried until a deadline),
//! which say the connection broke (the statement goes again on another), and what a missing
//! table means.

use super::Inner;
use crate::error::Error;

/// Whether `e` says the connection was broken (so the statement can go again on another).
pub(super) fn broken(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_) | sqlx::Error::Protocol(_))
}

/// Whether the database rolled the whole transaction back to break a deadlock or a
/// serialization conflict: nothing of it happened, and it may simply go again.
pub(super) fn rolled_back(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(d) = e else {
        return false;
    };
    if let Some(my) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return my.number() == 1213; // ER_LOCK_DEADLOCK
    }
    d.code()
        .is_some_and(|c| matches!(c.as_ref(), "40001" | "40P01"))
}

/// SQLSTATEs of PostgreSQL (and SQLite's codes) of failures that may pass: serialization
/// failures, deadlocks, lock timeouts, cancelled statements, a server shutting down, starting
/// or full (too many connections), a busy or locked SQLite database.
const PASSING: &[&str] = &[
    "40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53300", "08006", "08001", "5",
    "6", "261", "517",
];

/// MySQL's and MariaDB's error numbers of failures that may pass. MySQL answers most errors
/// with the generic SQLSTATE `HY000`, the ones that pass and the ones that never will alike,
/// so the number decides: lock waits and deadlocks, too many connections, a server shutting
/// down, a connection killed or cut, a statement interrupted or timed out, a prepared
/// statement to prepare again.
const MYSQL_PASSING: &[u16] = &[
    1040, // ER_CON_COUNT_ERROR: too many connections
    1053, // ER_SERVER_SHUTDOWN
    1158, 1159, 1160, 1161, // ER_NET_READ_ERROR .. ER_NET_WRITE_INTERRUPTED
    1203, // ER_TOO_MANY_USER_CONNECTIONS
    1205, // ER_LOCK_WAIT_TIMEOUT
    1213, // ER_LOCK_DEADLOCK
    1317, // ER_QUERY_INTERRUPTED
    1615, // ER_NEED_REPREPARE
    1927, // ER_CONNECTION_KILLED (MariaDB)
    1969, // ER_STATEMENT_TIMEOUT (MariaDB's max_statement_time)
    3024, // ER_QUERY_TIMEOUT (MySQL's max_execution_time)
    4031, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8: disconnected for inactivity)
];

/// Whether a refusal of the database may pass (worth retrying until a deadline).
fn passing(d: &dyn sqlx::error::DatabaseError) -> bool {
    if let Some(my) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return MYSQL_PASSING.contains(&my.number());
    }
    d.code().is_some_and(|c| PASSING.contains(&c.as_ref()))
}

/// What a database error says, on one line and once: the server's message without the
/// driver's framing (`error returned from database: `, `error communicating with database: `)
/// and without what sqlx adds to PostgreSQL's messages (` at line 948`: a line of the server's
/// own C source, not of anything the user wrote).
pub(crate) fn said(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => d.message().to_owned(),
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::Tls(tls) => tls.to_string(),
        sqlx::Error::Protocol(what) => what.clone(),
        sqlx::Error::PoolTimedOut => "no connection within the connect timeout".to_owned(),
        other => other.to_string(),
    }
}

/// A database error as the source of this library's error: its text is what [`said`] gives,
/// which the error's own message quotes, so a report of the causes says it once. `{:#?}` of the
/// error shows the driver's error whole.
struct DbError {
    text: String,
    driver: sqlx::Error,
}

impl DbError {
    fn new(driver: sqlx::Error) -> Self {
        DbError {
            text: said(&driver),
            driver,
        }
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::fmt::Debug for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.driver, f)
    }
}

impl std::error::Error for DbError {}

/// `err` with the database error that caused it as its source (see [`DbError`]).
pub(crate) fn caused_by(err: Error, e: sqlx::Error) -> Error {
    err.with_source(DbError::new(e))
}

/// A database failure as this library's error, naming what failed once, without the driver's
/// noise.
pub(super) fn map_error(e: sqlx::Error, inner: &Inner) -> Error {
    let table = &inner.table;
    let out = match &e {
        sqlx::Error::PoolTimedOut => {
            // The pool's words add nothing.
            return Error::storage(
                "cannot reach the database: no connection within the connect timeout",
            )
            .temporary();
        }
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => {
            Error::storage(format!("cannot reach the database: {}", said(&e))).temporary()
        }
        sqlx::Error::WorkerCrashed => {
            Error::storage("the database's connection worker stopped").temporary()
        }
        sqlx::Error::PoolClosed => Error::storage("the store's connections were closed"),
        sqlx::Error::Database(d) => {
            let code = d.code().map(|c| c.into_owned()).unwrap_or_default();
            let message = d.message();
            if code == "42P01" || code == "42S02" || message.contains("no such table") {
                Error::storage(format!(
                    "the lock table {table} (or its fencing table {table}_fence) does not exist: \
                     make it with `xtr-lock migrate --store <DSN>` (or add ?create_table=true \
                     to the DSN)"
                ))
            } else {
                let err = Error::storage(format!("the database refused: {message}"));
                if passing(d.as_ref()) {
                    err.temporary()
                } else {
                    err
                }
            }
        }
        _ => Error::storage(format!("the database failed: {}", said(&e))),
    };
    caused_by(out, e)
}
