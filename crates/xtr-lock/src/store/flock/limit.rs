//! The limit our clients keep beside a semaphore's slot files: `{name}.limit` in the same
//! directory, the limit in ASCII decimal and a newline. portalocker never reads it.
//!
//! The file is also our clients' mutex for the semaphore: an attempt holds it (`flock`
//! `LOCK_EX`) while it checks the limit and sweeps the slots, a reader of the usage holds it
//! shared. It is written in place while held exclusively, so a reader never sees half of it;
//! like the slot files it is never deleted.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::FlockOperation;
use rustix::io::Errno;

use super::dir::shown;
use super::file::{io_error, open_lock_file};
use super::name::limit_name;
use crate::error::{Error, Result};

/// How long an attempt waits for another client's attempt on the same semaphore (each takes
/// microseconds; only a stopped process holds it longer).
const PATIENCE: Duration = Duration::from_secs(2);

/// How long an attempt sleeps between two tries of the limit file's lock.
const NAP: Duration = Duration::from_millis(1);

/// The limit file of one semaphore, locked for the holder of this value.
pub(super) struct LimitFile {
    fd: OwnedFd,
    path: PathBuf,
}

impl LimitFile {
    /// Opens (creating it, 0666) and locks the limit file of semaphore `name` in `dir`:
    /// exclusively for an attempt, shared for a reader.
    pub(super) async fn locked(dir: &Path, name: &str, exclusive: bool) -> Result<LimitFile> {
        let path = dir.join(limit_name(name));
        let fd = open_lock_file(&path)?;
        let op = if exclusive {
            FlockOperation::NonBlockingLockExclusive
        } else {
            FlockOperation::NonBlockingLockShared
        };
        let started = tokio::time::Instant::now();
        loop {
            match rustix::fs::flock(&fd, op) {
                Ok(()) => return Ok(LimitFile { fd, path }),
                Err(Errno::WOULDBLOCK) if started.elapsed() < PATIENCE => {
                    tokio::time::sleep(NAP).await;
                }
                Err(Errno::WOULDBLOCK) => {
                    return Err(Error::storage(format!(
                        "the semaphore's limit file {} stayed locked for {PATIENCE:?} (a \
                         stopped process inside an attempt?)",
                        shown(&path)
                    ))
                    .temporary());
                }
                Err(e) => return Err(io_error("cannot lock", &path, e)),
            }
        }
    }

    /// The limit stored, if any (an empty or unreadable file has none).
    pub(super) fn read(&self) -> Result<Option<u32>> {
        let mut buf = [0u8; 16];
        let n = rustix::io::pread(&self.fd, &mut buf, 0)
            .map_err(|e| io_error("cannot read", &self.path, e))?;
        Ok(std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .filter(|l| *l > 0))
    }

    /// Stores `limit` (in place: the file is locked exclusively, so nobody reads meanwhile).
    pub(super) fn write(&self, limit: u32) -> Result<()> {
        let text = format!("{limit}\n");
        let fail = |e| io_error("cannot write", &self.path, e);
        let n = rustix::io::pwrite(&self.fd, text.as_bytes(), 0).map_err(fail)?;
        if n != text.len() {
            return Err(fail(Errno::IO));
        }
        rustix::fs::ftruncate(&self.fd, text.len() as u64).map_err(fail)
    }
}
