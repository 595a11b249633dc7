//! A holder's lock file: opening it as the peers do, locking it without ever claiming a file that
//! its name no longer leads to, and letting go of it.

use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustix::fs::{FlockOperation, Mode as FileMode, OFlags};
use rustix::io::Errno;

use super::dir::shown;
use super::records::Written;
use super::wake::Hub;
use crate::error::{Error, LostReason, Result};
use crate::key::{Key, Mode};
use crate::meta::HolderRecord;
use crate::mutex::lock;
use crate::store::Holding;

/// The handle a flock store keeps on a key: the holder's lock file, while it has one open.
pub(super) type FileHandle = Mutex<Option<HeldFile>>;

/// Which file a descriptor or a path is: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    // The field types differ between targets (`u64` on some, `c_ulong` on others).
    #[allow(clippy::useless_conversion)]
    fn of_stat(st: &rustix::fs::Stat) -> Self {
        FileId {
            dev: u64::from(st.st_dev),
            ino: u64::from(st.st_ino),
        }
    }
}

/// What one non-blocking attempt found.
pub(super) enum Attempt {
    Locked,
    /// Someone else holds it; `kept` is what this holder still holds.
    Conflict {
        kept: Option<Mode>,
    },
}

/// A holder's lock file: its name (kept, so a re-acquire does not hash the resource again), the
/// descriptor while open and which file it is, and the mode it holds it in (none while waiting or
/// released).
pub(super) struct HeldFile {
    pub(super) name: String,
    /// The descriptor, and which file it is once locked.
    fd: Option<(OwnedFd, Option<FileId>)>,
    pub(super) mode: Option<Mode>,
    /// The file held was found replaced (and let go of); said until the holder locks again.
    replaced: bool,
    /// The holder's record ([`records`](super::records)), while it holds.
    record: Option<Written>,
    hub: Arc<Hub>,
}

/// How many times an attempt starts over when the file it locked was replaced meanwhile.
const REPLACED_RETRIES: usize = 8;

impl HeldFile {
    pub(super) fn new(name: String, hub: Arc<Hub>) -> Self {
        HeldFile {
            name,
            fd: None,
            mode: None,
            replaced: false,
            record: None,
            hub,
        }
    }

    /// Writes (or, on a re-save, rewrites) the holder's record once it holds: best effort, a
    /// holder whose record cannot be written holds all the same.
    pub(super) fn keep_record(&mut self, key: &Key) {
        let Some((_, Some(id))) = &self.fd else {
            return;
        };
        let ino = id.ino;
        let old = self.record.take();
        let record = |at| HolderRecord::new(key.meta().map(|m| m.to_vec()), at);
        self.record = self.hub.records().write(old, ino, record, key.resource());
    }

    /// The open descriptor, if any.
    pub(super) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|(fd, _)| fd.as_fd())
    }

    /// One non-blocking attempt to hold the file in `mode`. With `keep_fd`, a descriptor opened
    /// for the attempt stays open after a conflict (a waiter retries on it).
    ///
    /// A lock is only ever reported on a file that still has a name: a file unlinked or renamed
    /// over between the open and the lock (someone cleaning lock files up) is let go of, and the
    /// attempt starts over on the new one. (A lock file renamed away instead is found by the
    /// later checks, which compare with the path.)
    pub(super) fn try_lock(&mut self, dir: &Path, mode: Mode, keep_fd: bool) -> Result<Attempt> {
        let path = dir.join(&self.name);
        for _ in 0..REPLACED_RETRIES {
            if self.mode == Some(mode) {
                if self.still_named(&path)? {
                    return Ok(Attempt::Locked);
                }
                self.close();
            }
            if self.fd.is_none() {
                self.fd = Some((open_lock_file(&path)?, None));
            }
            let before = self.mode;
            let fd = self.fd().expect("opened above");
            let locked = rustix::fs::flock(fd, operation(mode));
            // Unlinked or renamed over since it was opened, the file has no name left: one
            // `fstat`, which also tells which file later checks compare with.
            let stat = locked.is_ok().then(|| rustix::fs::fstat(fd));
            match locked {
                Ok(()) => {
                    self.mode = Some(mode);
                    let st = stat
                        .expect("stated when locked")
                        .map_err(|e| io_error("cannot stat", &path, e))?;
                    if st.st_nlink == 0 {
                        self.close();
                        continue;
                    }
                    if let Some((_, id)) = &mut self.fd {
                        *id = Some(FileId::of_stat(&st));
                    }
                    if before == Some(Mode::Write) {
                        // A demotion lets waiting readers in.
                        self.hub.notify(&self.name);
                    }
                    self.replaced = false;
                    return Ok(Attempt::Locked);
                }
                Err(Errno::WOULDBLOCK) => {
                    let kept = match before {
                        None => {
                            if !keep_fd {
                                self.close();
                            }
                            None
                        }
                        // Linux dropped the old lock before failing to convert it: take it back.
                        Some(old) => self.take_back(old),
                    };
                    return Ok(Attempt::Conflict { kept });
                }
                Err(errno) => {
                    if let Some(old) = before {
                        self.take_back(old);
                    } else {
                        self.close();
                    }
                    return Err(
                        Error::storage(format!("cannot lock {}: {errno}", shown(&path)))
                            .with_source(std::io::Error::from(errno)),
                    );
                }
            }
        }
        Err(Error::storage(format!(
            "cannot lock {}: it was replaced {REPLACED_RETRIES} times while being locked",
            shown(&path)
        )))
    }

    /// After a failed conversion: takes the old lock back at once, or lets go of everything.
    fn take_back(&mut self, old: Mode) -> Option<Mode> {
        let retaken = self
            .fd()
            .is_some_and(|fd| rustix::fs::flock(fd, operation(old)).is_ok());
        if retaken {
            self.mode = Some(old);
            Some(old)
        } else {
            self.close();
            None
        }
    }

    /// Whether the lock file's path still leads to the file this holder has open (it was not
    /// unlinked, or replaced by another file, since).
    pub(super) fn still_named(&self, path: &Path) -> Result<bool> {
        let Some((_, Some(id))) = &self.fd else {
            return Ok(false);
        };
        match rustix::fs::lstat(path) {
            Ok(st) => Ok(FileId::of_stat(&st) == *id),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(io_error("cannot stat", path, e)),
        }
    }

    /// What the holder holds, checked against the file the name leads to now; a replaced file
    /// is let go of, and reported as replaced until the holder locks again.
    pub(super) fn holding(&mut self, dir: &Path) -> Result<Holding> {
        let Some(mode) = self.mode else {
            return Ok(Holding::NotHeld(if self.replaced {
                LostReason::Replaced
            } else {
                LostReason::Removed
            }));
        };
        if self.still_named(&dir.join(&self.name))? {
            Ok(Holding::Held(mode))
        } else {
            self.close();
            self.replaced = true;
            Ok(Holding::NotHeld(LostReason::Replaced))
        }
    }

    /// Lets go of the file for a release: whether a lock was held on a file that still has a
    /// name (one `fstat`: unlinked or renamed over, it has no links left).
    pub(super) fn release(&mut self) -> bool {
        let named = self.mode.is_some()
            && !self.replaced
            && self.fd().is_some_and(|fd| {
                // A failing fstat says nothing about the lock: it was held.
                rustix::fs::fstat(fd).map_or(true, |st| st.st_nlink > 0)
            });
        let held = self.close();
        self.replaced = false;
        held && named
    }

    /// Unlocks without closing or waking anyone: a semaphore's attempt giving back a slot it
    /// held for a moment (no other of our clients could try it meanwhile), keeping the
    /// descriptor for the next attempt, so no close event wakes the other waiters.
    pub(super) fn unlock_quietly(&mut self) {
        if let Some(record) = self.record.take() {
            self.hub.records().release(record);
        }
        if self.mode.take().is_some()
            && let Some((fd, _)) = &self.fd
        {
            let _ = rustix::fs::flock(fd, FlockOperation::NonBlockingUnlock);
        }
    }

    /// Whether a lock is held (as this process last left it).
    pub(super) fn is_locked(&self) -> bool {
        self.mode.is_some()
    }

    /// Unlocks (also covering descriptors a child inherited) and closes; wakes local waiters.
    /// Returns whether a lock was held.
    pub(super) fn close(&mut self) -> bool {
        // Before the lock goes, so a record never outlives it.
        if let Some(record) = self.record.take() {
            self.hub.records().release(record);
        }
        let held = self.mode.take().is_some();
        if let Some((fd, _)) = self.fd.take() {
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

pub(super) fn io_error(what: &str, path: &Path, errno: Errno) -> Error {
    Error::storage(format!("{what} lock file {}: {errno}", shown(path)))
        .with_source(std::io::Error::from(errno))
}

fn operation(mode: Mode) -> FlockOperation {
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

/// What the holder whose handle is `handle` holds (no handle: it never held, or let go).
pub(super) fn holding_of(handle: Option<&FileHandle>, dir: &Path) -> Result<Holding> {
    let Some(handle) = handle else {
        return Ok(Holding::NotHeld(LostReason::Removed));
    };
    let mut slot = lock(handle);
    match slot.as_mut() {
        Some(held) => held.holding(dir),
        None => Ok(Holding::NotHeld(LostReason::Removed)),
    }
}
