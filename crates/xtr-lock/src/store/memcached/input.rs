//! What a [`MemcachedStore`] accepts (names Memcached keeps unchanged, ttls in whole seconds
//! it reads as durations) and how its I/O errors read.

use std::io;
use std::time::Duration;

use super::{MAX_TTL_SECS, MemcachedStore, records};
use crate::error::{Error, Result};
use crate::key::Key;

impl MemcachedStore {
    pub(super) fn name(&self, resource: &str) -> Result<String> {
        if records::is_reserved(resource) {
            return Err(Error::invalid_argument(
                "names holding `#xtr-holder` or `:sem:holder:`, or starting with `xtr-holder#`, are \
                 where Memcached keeps this library's holder records",
            )
            .with_resource(resource.chars().take(100).collect::<String>())
            .with_store(self));
        }
        if Self::is_valid_name(resource) {
            return Ok(resource.to_owned());
        }
        Err(Error::invalid_argument(
            "Memcached keeps a lock under its name, which must be 1 to 250 bytes without spaces \
             or control characters (it is not hashed, so that PHP processes share the lock)",
        )
        .with_resource(resource.chars().take(100).collect::<String>())
        .with_store(self))
    }

    /// The whole seconds the entry keeps for `ttl`: rounded up, at least 2, at most 30 days.
    pub(super) fn seconds(&self, key: &Key, ttl: Option<Duration>) -> Result<u64> {
        let Some(ttl) = ttl else {
            return Err(Error::invalid_argument(
                "a lock in Memcached needs a ttl (entries expire; there is no silent default): \
                 give the lock one",
            )
            .with_resource(key.resource())
            .with_store(self));
        };
        let secs = crate::clock::seconds_up(ttl);
        if secs > MAX_TTL_SECS {
            return Err(Error::invalid_argument(format!(
                "a ttl of {ttl:?} is over Memcached's 30 days (it would read it as a Unix \
                 timestamp)"
            ))
            .with_resource(key.resource())
            .with_store(self));
        }
        Ok(secs)
    }

    pub(super) fn io_error(&self, resource: &str, err: io::Error) -> Error {
        let unsupported = err.kind() == io::ErrorKind::Unsupported;
        let temporary = matches!(
            err.kind(),
            io::ErrorKind::TimedOut
                | io::ErrorKind::ConnectionRefused
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::NotConnected
        );
        let e = if unsupported {
            Error::unsupported(err.to_string())
        } else {
            Error::storage(format!("Memcached: {err}"))
        };
        let e = e.with_resource(resource).with_store(self).with_source(err);
        if temporary { e.temporary() } else { e }
    }
}
