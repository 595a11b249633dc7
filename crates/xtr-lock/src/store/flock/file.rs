//! A holder's lock file: opening it as the peers do, and letting go of it.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{FlockOperation, Mode as FileMode, OFlags};
use rustix::io::Errno;

use super::dir::shown;
use super::wake::Hub;
use crate::error::{Error, Result};
use crate::key::Mode;

/// A holder's lock file: its name (kept, so a re-acquire does not hash the resource again), the
/// descriptor while open, and the mode it holds it in (none while waiting or released).
pub(super) struct HeldFile {
    pub(super) name: String,
    pub(super) fd: Option<OwnedFd>,
    pub(super) mode: Option<Mode>,
    pub(super) hub: Arc<Hub>,
}

impl HeldFile {
    /// Unlocks (also covering descriptors a child inherited) and closes; wakes local waiters.
    /// Returns whether a lock was held.
    pub(super) fn close(&mut self) -> bool {
        let held = self.mode.take().is_some();
        if let Some(fd) = self.fd.take() {
            if held {
                let _ = rustix::fs::flock(&fd, FlockOperation::NonBlockingUnlock);
            }
            drop(fd);
            if held {
                self.hub.notify(&self.name);
            }
        }
        held
    }
}

impl Drop for HeldFile {
    fn drop(&mut self) {
        self.close();
    }
}

pub(super) fn operation(mode: Mode) -> FlockOperation {
    match mode {
        Mode::Write => FlockOperation::NonBlockingLockExclusive,
        Mode::Read => FlockOperation::NonBlockingLockShared,
    }
}

/// Opens (or creates, 0666 whatever the umask) the lock file, never following a symlink, falling
/// back to read-only for a file another user created.
pub(super) fn open_lock_file(path: &Path) -> Result<OwnedFd> {
    let common = OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let fail = |errno: Errno| {
        Error::storage(format!("cannot open lock file {}: {errno}", shown(path)))
            .with_source(std::io::Error::from(errno))
    };
    // Bounded: each round either opens, or loses a create race to a file that then exists.
    for _ in 0..8 {
        match rustix::fs::open(path, OFlags::RDWR | common, FileMode::empty()) {
            Ok(fd) => return Ok(fd),
            Err(Errno::ACCESS | Errno::PERM) => {
                return rustix::fs::open(path, OFlags::RDONLY | common, FileMode::empty())
                    .map_err(fail);
            }
            Err(Errno::NOENT) => {}
            Err(errno) => return Err(fail(errno)),
        }
        let create = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | common;
        match rustix::fs::open(path, create, FileMode::from_raw_mode(0o666)) {
            Ok(fd) => {
                // Undo the umask, so other users' processes can open it too.
                let _ = rustix::fs::fchmod(&fd, FileMode::from_raw_mode(0o666));
                return Ok(fd);
            }
            Err(Errno::EXIST) => continue,
            Err(errno) => return Err(fail(errno)),
        }
    }
    Err(fail(Errno::AGAIN))
}
