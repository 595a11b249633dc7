//! Holder records of the flock store: small files in `.xtr-holders/`, a directory of its own
//! inside the lock directory, each holding one holder's [`HolderRecord`] beside the lock file's
//! inode and the resource.
//!
//! The directory is ours alone: `flock(1)`, Python xtr-lock, portalocker and Symfony only
//! ever open `*.lock` files they name themselves, and a directory named without `.lock` is
//! never any resource's lock file nor a semaphore's slot file. Files in it make no inotify
//! events on the lock directory's watch (inotify does not recurse), so records wake no waiter.
//!
//! A record file is named `<pid>.<n>` (the process, a number unique in it) and holds
//! `<inode> <length>\n` then `<length>` bytes: the record's JSON line, a newline, the resource.
//! It is written after the `flock` is taken and marked free (its first byte made `-`) before
//! the lock is let go, so a record never outlives its lock in a living process. Creating and
//! unlinking a file per acquisition cost more than the cycle itself (about 22 µs against 6 µs
//! on ext4), so a process keeps its record files open and reuses them: an acquisition costs one
//! `pwrite`, a release another of one byte. A record is shown only while `/proc/locks` shows
//! its process holding its inode; a killed process's files stay behind (never shown: its
//! process holds nothing) until a listing finds the process gone and removes them.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use rustix::fs::{Mode as FileMode, OFlags};
use rustix::io::Errno;

use crate::logging::TARGET;
use crate::meta::HolderRecord;
use crate::mutex::lock;

/// The records' directory, inside the lock directory.
pub(crate) const DIR: &str = ".xtr-holders";

/// The longest record file read (a record carries at most 1 KiB of metadata, base64-encoded,
/// and a resource name).
const MAX_RECORD: usize = 64 * 1024;

/// How many free record files a process keeps open for later holders.
const FREE_KEPT: usize = 32;

/// The records' directory of one lock directory, opened on first use, with this process's
/// free record files.
pub(crate) struct Sidecar {
    path: PathBuf,
    fd: OnceLock<OwnedFd>,
    free: Mutex<Vec<RecordFile>>,
}

/// One record file of this process, open.
#[derive(Debug)]
pub(crate) struct RecordFile {
    name: String,
    fd: OwnedFd,
}

/// The record a holder of this process keeps while it holds, and when it acquired (kept by
/// re-saves).
#[derive(Debug)]
pub(crate) struct Written {
    file: RecordFile,
    ino: u64,
    acquired_at: SystemTime,
}

/// Who a record is of: the process and the lock file's inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Owner {
    pub(crate) ino: u64,
    pub(crate) pid: u32,
}

/// The live records of the processes asked about, by owner.
#[derive(Debug, Default)]
pub(crate) struct Found {
    by_owner: HashMap<Owner, Vec<(HolderRecord, String)>>,
}

impl Found {
    /// The next record of `owner` not handed out yet (a process holding one file twice, as two
    /// readers, has two), with the resource it names.
    pub(crate) fn take(&mut self, owner: Owner) -> Option<(HolderRecord, String)> {
        let records = self.by_owner.get_mut(&owner)?;
        let record = records.pop();
        if records.is_empty() {
            self.by_owner.remove(&owner);
        }
        record
    }
}

fn next_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `<pid>.<n>` → the process; `None` for a name that is not a record file's.
fn pid_of(name: &str) -> Option<u32> {
    let (pid, n) = name.split_once('.')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// A record file's contents → its owner's inode, the record and the resource; `None` for a
/// free file or anything else.
fn parse(text: &[u8]) -> Option<(u64, HolderRecord, String)> {
    let newline = text.iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&text[..newline]).ok()?;
    let (ino, len) = header.split_once(' ')?;
    let (ino, len) = (ino.parse().ok()?, len.parse::<usize>().ok()?);
    let body = text.get(newline + 1..newline + 1 + len)?;
    let split = body.iter().position(|b| *b == b'\n')?;
    let record = HolderRecord::decode(&body[..split])?;
    let resource = String::from_utf8(body[split + 1..].to_vec()).ok()?;
    Some((ino, record, resource))
}

/// Whether process `pid` still runs (on this machine's pid namespace).
fn alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(rustix::process::test_kill_process(pid), Err(Errno::SRCH))
}

impl Sidecar {
    pub(crate) fn new(lock_dir: &Path) -> Self {
        Sidecar {
            path: lock_dir.join(DIR),
            fd: OnceLock::new(),
            free: Mutex::new(Vec::new()),
        }
    }

    /// The directory, opened (and, with `create`, made with the lock directory's mode, so a
    /// directory shared by several users shares the records too). Never a symlink. `None` while
    /// it cannot be opened: tried again next time.
    fn dir(&self, create: bool) -> Option<BorrowedFd<'_>> {
        if let Some(fd) = self.fd.get() {
            return Some(fd.as_fd());
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let opened = match rustix::fs::open(&self.path, flags, FileMode::empty()) {
            Err(Errno::NOENT) if create => {
                let parent = self.path.parent().unwrap_or(Path::new("."));
                let mode = rustix::fs::stat(parent).map_or(0o700, |st| st.st_mode & 0o7777);
                match rustix::fs::mkdir(&self.path, FileMode::from_raw_mode(mode)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return self.unusable("cannot make", e),
                }
                let fd = rustix::fs::open(&self.path, flags, FileMode::empty());
                if let Ok(fd) = &fd {
                    // Undo the umask (a shared directory's group or sticky bits).
                    let _ = rustix::fs::fchmod(fd, FileMode::from_raw_mode(mode));
                }
                fd
            }
            other => other,
        };
        match opened {
            Ok(fd) => {
                let _ = self.fd.set(fd);
                self.fd.get().map(|fd| fd.as_fd())
            }
            Err(Errno::NOENT) => None,
            Err(e) => self.unusable("cannot open", e),
        }
    }

    fn unusable<T>(&self, what: &str, e: Errno) -> Option<T> {
        tracing::debug!(target: TARGET, error = %e, dir = %self.path.display(),
            "{what} the holder records' directory; holders show without metadata");
        None
    }

    /// A record file for a new holder: a free one of this process, or a new one (a file left
    /// by a dead process that had this pid is taken over).
    fn file(&self) -> Option<RecordFile> {
        if let Some(file) = lock(&self.free).pop() {
            return Some(file);
        }
        let dir = self.dir(true)?;
        let name = format!("{}.{}", std::process::id(), next_number());
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name.as_str(), flags, FileMode::from_raw_mode(0o644));
        fd.ok().map(|fd| RecordFile { name, fd })
    }

    /// Writes the record of a holder of this process on the file `ino`, replacing `old` (its
    /// earlier record, whose acquisition time a re-save of the same file keeps). Best effort:
    /// a lock directory this user may not write in (another user's, with lock files made
    /// there before) still locks, its holders show without a record.
    pub(crate) fn write(
        &self,
        old: Option<Written>,
        ino: u64,
        record: impl FnOnce(SystemTime) -> HolderRecord,
        resource: &str,
    ) -> Option<Written> {
        let (file, at) = match old {
            Some(w) if w.ino == ino => (w.file, w.acquired_at),
            old => {
                if let Some(w) = old {
                    self.release(w);
                }
                (self.file()?, SystemTime::now())
            }
        };
        let body = format!("{}\n{resource}", record(at).encode());
        let text = format!("{ino} {}\n{body}", body.len());
        match rustix::io::pwrite(&file.fd, text.as_bytes(), 0) {
            Ok(n) if n == text.len() => Some(Written {
                file,
                ino,
                acquired_at: at,
            }),
            Ok(_) | Err(_) => {
                self.discard(file);
                None
            }
        }
    }

    /// Marks a holder's record free (before its lock goes) and keeps the file for the next.
    pub(crate) fn release(&self, written: Written) {
        let file = written.file;
        if rustix::io::pwrite(&file.fd, b"-", 0) != Ok(1) {
            return self.discard(file);
        }
        let mut free = lock(&self.free);
        if free.len() < FREE_KEPT {
            free.push(file);
        } else {
            drop(free);
            self.discard(file);
        }
    }

    fn discard(&self, file: RecordFile) {
        if let Some(dir) = self.dir(false) {
            let _ = rustix::fs::unlinkat(dir, file.name.as_str(), rustix::fs::AtFlags::empty());
        }
    }

    /// The live records of the processes `pids`; with `prune`, the files of processes that are
    /// gone are removed (a killed holder's).
    pub(crate) fn read(&self, pids: &HashSet<u32>, prune: bool) -> Found {
        let mut found = Found::default();
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return found;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some((name, pid)) = name.to_str().and_then(|n| Some((n, pid_of(n)?))) else {
                continue;
            };
            if pids.contains(&pid) {
                if let Some((ino, record, resource)) = self.read_one(name) {
                    let owner = Owner { ino, pid };
                    found
                        .by_owner
                        .entry(owner)
                        .or_default()
                        .push((record, resource));
                }
            } else if prune
                && !alive(pid)
                && let Some(dir) = self.dir(false)
            {
                let _ = rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty());
            }
        }
        found
    }

    fn read_one(&self, name: &str) -> Option<(u64, HolderRecord, String)> {
        let dir = self.dir(false)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name, flags, FileMode::empty()).ok()?;
        let mut text = vec![0u8; 2048];
        let mut len = 0;
        loop {
            if len == text.len() {
                if text.len() >= MAX_RECORD {
                    return None;
                }
                text.resize(text.len() * 2, 0);
            }
            match rustix::io::read(&fd, &mut text[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(Errno::INTR) => {}
                Err(_) => return None,
            }
        }
        parse(&text[..len])
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        for file in std::mem::take(&mut *lock(&self.free)) {
            self.discard(file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_written_read_reused_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let side = Sidecar::new(dir.path());
        let me = std::process::id();
        let pids: HashSet<u32> = [me].into();
        assert!(
            side.read(&pids, false).by_owner.is_empty(),
            "no directory yet"
        );
        let at = std::time::UNIX_EPOCH;
        let rec = |meta: &[u8]| {
            let meta = meta.to_vec();
            move |_at| HolderRecord::new(Some(meta), at)
        };
        let w = side
            .write(None, 7, rec(b"a long value"), "res\nline")
            .unwrap();
        let first_at = w.acquired_at;
        let mut found = side.read(&pids, false);
        let (r, resource) = found.take(Owner { ino: 7, pid: me }).unwrap();
        assert_eq!(r.meta.as_deref(), Some(&b"a long value"[..]));
        assert_eq!(resource, "res\nline");
        let w = side.write(Some(w), 7, rec(b"b"), "r").unwrap();
        assert_eq!(
            w.acquired_at, first_at,
            "a re-save keeps the acquisition time"
        );
        let mut found = side.read(&pids, false);
        let (r, resource) = found.take(Owner { ino: 7, pid: me }).unwrap();
        assert_eq!(
            (r.meta.as_deref(), resource.as_str()),
            (Some(&b"b"[..]), "r")
        );
        assert!(found.take(Owner { ino: 7, pid: me }).is_none());

        let name = w.file.name.clone();
        side.release(w);
        assert!(
            side.read(&pids, false).by_owner.is_empty(),
            "a free file is no record"
        );
        let again = side.write(None, 8, rec(b"c"), "s").unwrap();
        assert_eq!(again.file.name, name, "the free file is reused");
        side.release(again);

        // A dead process's file: never read for it, removed by a pruning read.
        let dead = dir.path().join(DIR).join("999999999.0");
        std::fs::write(&dead, "7 3\nxyz").unwrap();
        let _ = side.read(&[999_999_999].into(), false);
        assert!(dead.exists());
        let _ = side.read(&pids, true);
        assert!(!dead.exists(), "pruned");
        assert_eq!(pid_of("1.2"), Some(1));
        assert_eq!(pid_of("1.2.3"), None);
        assert_eq!(parse(b"-7 3\nxyz"), None);
        drop(side);
        let left = std::fs::read_dir(dir.path().join(DIR)).unwrap().count();
        assert_eq!(left, 0, "free files go with the store");
    }
}
