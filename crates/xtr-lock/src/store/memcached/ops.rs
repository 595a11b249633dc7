//! The store's operations as request sequences on one connection: each reads before it writes,
//! so any of them can be sent again after a connection was found closed.

use std::io;

use super::conn::{Conn, Stored};

/// How often an operation reads again when the entry changed between its read and its
/// conditional write (its own holder refreshing concurrently, a lock changing hands).
const ROUNDS: usize = 5;

/// What an acquire found.
pub(super) enum Attempt {
    Acquired,
    /// Someone else holds it: their token, and for how many seconds more if known.
    Refused(Vec<u8>, Option<u64>),
}

/// Add; else re-take the holder's own entry by CAS; else refused.
pub(super) async fn acquire_on(
    c: &mut Conn,
    name: &str,
    token: &[u8],
    secs: u64,
) -> io::Result<Attempt> {
    for _ in 0..ROUNDS {
        match c.add(name, token, secs).await? {
            Stored::Done => return Ok(Attempt::Acquired),
            Stored::Exists => {}
            other => return Err(unexpected("an add", other)),
        }
        match c.get(name).await? {
            // Gone since the add: add again.
            None => continue,
            Some(e) if e.value == token => match c.replace_if(name, token, secs, e.cas).await? {
                Stored::Done => return Ok(Attempt::Acquired),
                Stored::Changed | Stored::Missing => continue,
                other => return Err(unexpected("a CAS replace", other)),
            },
            Some(e) => return Ok(Attempt::Refused(e.value, e.ttl)),
        }
    }
    Ok(Attempt::Refused(Vec::new(), None))
}

/// Extends the holder's own entry by CAS; never re-creates one that is gone.
pub(super) async fn put_off_on(
    c: &mut Conn,
    name: &str,
    token: &[u8],
    secs: u64,
) -> io::Result<Found> {
    for _ in 0..ROUNDS {
        match c.get(name).await? {
            None => return Ok(Found::Missing),
            Some(e) if e.value != token => return Ok(Found::Other),
            Some(e) => match c.replace_if(name, token, secs, e.cas).await? {
                Stored::Done => return Ok(Found::Ours),
                Stored::Changed => continue,
                Stored::Missing => return Ok(Found::Missing),
                other => return Err(unexpected("a CAS replace", other)),
            },
        }
    }
    Err(io::Error::other(
        "the entry kept changing between read and write",
    ))
}

/// Deletes the holder's own entry by CAS: an entry that changed hands is never deleted.
pub(super) async fn delete_on(c: &mut Conn, name: &str, token: &[u8]) -> io::Result<bool> {
    for _ in 0..ROUNDS {
        match c.get(name).await? {
            None => return Ok(false),
            Some(e) if e.value != token => return Ok(false),
            Some(e) => match c.delete_if(name, e.cas).await? {
                Stored::Done => return Ok(true),
                // Touched since the read (its own refresh, or it changed hands): read again.
                Stored::Changed => continue,
                Stored::Missing => return Ok(false),
                other => return Err(unexpected("a CAS delete", other)),
            },
        }
    }
    Err(io::Error::other(
        "the entry kept changing between read and delete",
    ))
}

/// What a holder's entry is now.
pub(super) enum Found {
    Ours,
    Other,
    Missing,
}

pub(super) fn unexpected(what: &str, got: Stored) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected answer to {what}: {got:?}"),
    )
}
