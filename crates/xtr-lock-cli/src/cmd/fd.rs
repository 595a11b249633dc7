//! `acquire --fd N` and `path`: flock(1)'s `exec 9>FILE; flock -n 9`, which locks a section of
//! a script, on the flock store.
//!
//! The shell opens the resource's lock file (`path` names it) on a descriptor of its own, and
//! `acquire --fd` locks that descriptor, as `flock 9` does: a `flock(2)` lock belongs to the
//! open file, which the shell and this process share, so it outlives `xtr-lock` and lasts until
//! the shell closes the descriptor (`exec 9>&-`) or exits. `xtr-lock` cannot do the opening: a
//! process cannot open a descriptor in its parent.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use rustix::fs::{FileType, FlockOperation};
use rustix::io::Errno;
use rustix::process::{PidfdFlags, PidfdGetfdFlags};
use xtr_lock::{Mode, Wait};

use crate::args::Take;
use crate::exit::Exit;
use crate::output::{StatusLine, mode_name, print};
use crate::store::StoreConfig;

/// The longest pause between two attempts while the lock is held: the flock store's own
/// safety-net poll. (It wakes its waiters by watching the directory; a descriptor of the shell's
/// is not its own, so this one only polls, from 2 ms up.)
const POLL: Duration = Duration::from_millis(100);

/// `path RESOURCE`: prints the lock file.
pub(crate) fn path(store: &StoreConfig, resource: &str) -> Result<Exit> {
    print(&lock_file(store, resource)?.display().to_string())?;
    Ok(Exit::Ok)
}

/// The caller's descriptor that `acquire --fd N` locks: a duplicate, the same open file (so a
/// lock taken on it is the caller's), taken before this process opens descriptors of its own.
pub(crate) struct Inherited {
    number: i32,
    fd: OwnedFd,
}

impl Inherited {
    /// Takes hold of descriptor `number`; an error if it is not open.
    pub(crate) fn take(number: i32) -> Result<Inherited> {
        // Through a pidfd of this very process (the copy is close-on-exec): a descriptor known
        // by its number only cannot be borrowed without `unsafe`, which this workspace forbids.
        let me = rustix::process::pidfd_open(rustix::process::getpid(), PidfdFlags::empty())
            .map_err(|e| anyhow!("cannot reach descriptor {number}: pidfd_open: {e}"))?;
        match rustix::process::pidfd_getfd(&me, number, PidfdGetfdFlags::empty()) {
            Ok(fd) => Ok(Inherited { number, fd }),
            Err(Errno::BADF) => Err(anyhow!(
                "descriptor {number} is not open: open the resource's lock file on it first \
                 (exec {number}>\"$(xtr-lock path RESOURCE)\")"
            )),
            Err(e) => Err(anyhow!(
                "cannot reach descriptor {number}: pidfd_getfd: {e} (it needs Linux 5.6 or later)"
            )),
        }
    }
}

/// `acquire --fd N RESOURCE`: locks the caller's descriptor N, which must be `resource`'s lock
/// file, as `take` says (`-s`, `-n`, `-w`); prints nothing.
pub(crate) async fn lock(
    store: StoreConfig,
    take: Take,
    resource: String,
    inherited: Inherited,
) -> Result<Exit> {
    let file = lock_file(&store, &resource)?;
    let fd = inherited.number;
    let shared = checked(inherited, &resource, &file)?;
    let Some(took) = wait_for(&shared, &store, &take, &resource).await? else {
        return conflict(&resource, &take);
    };
    if !still_the_lock_file(&shared, &file) {
        // Removed (or replaced) while this waited: its lock excludes nobody who opens the path
        // now. Let go, as the flock store does when it finds its file gone.
        let _ = rustix::fs::flock(&shared, FlockOperation::Unlock);
        return Err(anyhow!(
            "the lock file of {resource:?} ({}) was removed or replaced while waiting: open it              again (exec {fd}>\"$(xtr-lock path {resource:?})\") and retry",
            file.display()
        ));
    }
    if take.verbose {
        let what = format!("{}, descriptor {fd}", mode_name(take.mode));
        eprintln!("{}", super::took_line_of(&resource, took, &what));
    }
    Ok(Exit::Ok)
}

fn conflict(resource: &str, take: &Take) -> Result<Exit> {
    if !take.quiet {
        eprintln!(
            "{}",
            super::conflict_message(resource, take, super::Refused::Held)
        );
    }
    Ok(Exit::Conflict(take.conflict_exit_code))
}

/// Whether the locked descriptor is still the file at `file` (not unlinked, not replaced).
fn still_the_lock_file(locked: &OwnedFd, file: &Path) -> bool {
    let Ok(ours) = rustix::fs::fstat(locked) else {
        return false;
    };
    ours.st_nlink > 0
        && rustix::fs::lstat(file)
            .is_ok_and(|named| named.st_dev == ours.st_dev && named.st_ino == ours.st_ino)
}

/// The lock file of `resource`, on the flock store only.
fn lock_file(store: &StoreConfig, resource: &str) -> Result<PathBuf> {
    if store.scheme != "flock" {
        return Err(anyhow!(
            "only the flock store has a lock file for a shell to open (this store is {}): use \
             `xtr-lock run`, or a key printed by `xtr-lock acquire`",
            store.scheme
        ));
    }
    store
        .store
        .location(resource)
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("the flock store names no lock file for {resource:?}"))
}

/// The inherited descriptor, checked to be `file`: a lock on another file would exclude nobody.
fn checked(inherited: Inherited, resource: &str, file: &Path) -> Result<OwnedFd> {
    let Inherited {
        number: fd,
        fd: dup,
    } = inherited;
    let ours = rustix::fs::fstat(&dup).map_err(|e| anyhow!("descriptor {fd}: {e}"))?;
    let same = rustix::fs::lstat(file).is_ok_and(|named| {
        named.st_dev == ours.st_dev
            && named.st_ino == ours.st_ino
            && FileType::from_raw_mode(named.st_mode) == FileType::RegularFile
    });
    if !same {
        return Err(anyhow!(
            "descriptor {fd} is not the lock file of {resource:?} ({}): open it first \
             (exec {fd}>\"$(xtr-lock path {resource:?})\")",
            file.display()
        ));
    }
    Ok(dup)
}

/// Locks `shared` as `take` says: `Some(how long it took)`, or `None` when it stays held by
/// someone else (`-n`, or `-w` ran out). Only non-blocking attempts, so that no lock can be
/// taken after the wait was given up.
async fn wait_for(
    shared: &OwnedFd,
    store: &StoreConfig,
    take: &Take,
    resource: &str,
) -> Result<Option<Duration>> {
    let started = Instant::now();
    let operation = if take.mode == Mode::Read {
        FlockOperation::NonBlockingLockShared
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    let deadline = match take.wait {
        Wait::Never => Some(started),
        Wait::AtMost(d) => Some(started + d),
        Wait::Forever => None,
    };
    let mut status_line = None;
    let mut pause = Duration::from_millis(2);
    loop {
        match rustix::fs::flock(shared, operation) {
            Ok(()) => return Ok(Some(started.elapsed())),
            Err(Errno::WOULDBLOCK | Errno::INTR) => {}
            Err(e) => return Err(anyhow!("cannot lock the lock file of {resource:?}: {e}")),
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return Ok(None);
        }
        status_line.get_or_insert_with(|| {
            StatusLine::start(
                store.store.clone(),
                xtr_lock::Key::new(resource),
                take.quiet,
            )
        });
        tokio::time::sleep(left.map_or(pause, |left| left.min(pause))).await;
        pause = (pause * 2).min(POLL);
    }
}
