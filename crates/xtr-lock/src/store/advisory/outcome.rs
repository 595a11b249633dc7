//! How a session's statements ended, in the words the session task decides on.

use super::conns::ConnectError;
use super::db::Failure;
use crate::error::Error;
use crate::store::sql::errors::said;

/// How a lock statement ended.
pub(super) enum Ran {
    Granted,
    Refused,
    /// Cancelled or killed (PostgreSQL's 57014, MySQL's 1317 or a `GET_LOCK` answering NULL):
    /// by this session's own cancel request, or an operator's.
    Cancelled,
    /// A deadlock (PostgreSQL's 40P01): two holders promoting at once; this one was chosen to
    /// give way.
    Deadlock,
    /// The server refused with another error; the connection is still fine.
    Refusal(String),
    /// The connection broke or stopped answering: it is gone.
    Broken(String),
}

pub(super) fn classify(result: std::result::Result<Option<bool>, sqlx::Error>) -> Ran {
    match result {
        Ok(Some(true)) => Ran::Granted,
        Ok(Some(false)) => Ran::Refused,
        // GET_LOCK's NULL: the statement was killed.
        Ok(None) => Ran::Cancelled,
        Err(e) => match super::db::classify(&e) {
            Failure::Cancelled => Ran::Cancelled,
            Failure::Deadlock => Ran::Deadlock,
            Failure::Broken(why) => Ran::Broken(why),
            Failure::Refused(why) => Ran::Refusal(why),
        },
    }
}

pub(super) fn is_broken(e: &sqlx::Error) -> bool {
    super::db::is_broken(e)
}

pub(super) fn connect_error(e: ConnectError) -> Error {
    match e {
        ConnectError::TimedOut(t) => Error::storage(format!(
            "cannot reach the database: no connection within the connect timeout ({} s)",
            t.as_secs_f64()
        ))
        .temporary(),
        ConnectError::Sqlx(e) => {
            let temporary = is_broken(&e);
            let err = Error::storage(format!("cannot connect to the database: {}", said(&e)));
            if temporary { err.temporary() } else { err }
        }
    }
}
