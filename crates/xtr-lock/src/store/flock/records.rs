//! Holder records of the flock store: one small file per holder in `.xtr-holders/`, a
//! directory of its own inside the lock directory, holding the holder's
//! [`HolderRecord`] (one JSON line) and, on the next line, its resource.
//!
//! The directory is ours alone: `flock(1)`, Python xtr-lock, portalocker and Symfony only
//! ever open `*.lock` files they name themselves, and a directory named without `.lock` is
//! never any resource's lock file nor a semaphore's slot file. Files in it make no inotify
//! events on the lock directory's watch (inotify does not recurse), so writing records wakes no
//! waiter.
//!
//! A record is named `<inode>.<pid>.<n>`: the lock file's inode (a replaced lock file is
//! another inode, so its records no longer match), the holder's process and a number unique in
//! that process. It is written after the `flock` is taken and removed before it is let go, so a
//! record never outlives its lock in a living process; a killed holder's record stays behind,
//! and is ignored (and pruned by the next listing) because `/proc/locks` shows no lock of that
//! process on that inode.

use std::collections::HashMap;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{Mode as FileMode, OFlags};
use rustix::io::Errno;

use crate::logging::TARGET;
use crate::meta::HolderRecord;

/// The records' directory, inside the lock directory.
pub(crate) const DIR: &str = ".xtr-holders";

/// The longest record file read (a record carries at most 1 KiB of metadata, base64-encoded,
/// and a resource name).
const MAX_RECORD: usize = 64 * 1024;

/// The records' directory of one lock directory, opened on first use.
pub(crate) struct Sidecar {
    path: PathBuf,
    fd: OnceLock<OwnedFd>,
}

/// One record's name, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Owner {
    pub(crate) ino: u64,
    pub(crate) pid: u32,
}

/// A record file a holder of this process wrote, and when it acquired (kept by re-saves).
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) name: String,
    pub(crate) ino: u64,
    pub(crate) acquired_at: std::time::SystemTime,
}

/// The record file names found by one read of the directory, by owner.
#[derive(Debug, Default)]
pub(crate) struct Found {
    by_owner: HashMap<Owner, Vec<String>>,
}

impl Found {
    /// The next record of `owner` not handed out yet (a process holding one file twice, as two
    /// readers, has two).
    pub(crate) fn take(&mut self, owner: Owner) -> Option<String> {
        let names = self.by_owner.get_mut(&owner)?;
        let name = names.pop();
        if names.is_empty() {
            self.by_owner.remove(&owner);
        }
        name
    }

    /// The records left whose owner `held` says holds nothing: killed holders'.
    pub(crate) fn stale(self, held: impl Fn(Owner) -> bool) -> Vec<String> {
        self.by_owner
            .into_iter()
            .filter(|(owner, _)| !held(*owner))
            .flat_map(|(_, names)| names)
            .collect()
    }
}

fn next_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `<inode>.<pid>.<n>` → the owner; `None` for a name that is not a record's.
fn parse(name: &str) -> Option<Owner> {
    let mut parts = name.split('.');
    let ino = parts.next()?.parse().ok()?;
    let pid = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u64>().ok()?;
    parts.next().is_none().then_some(Owner { ino, pid })
}

impl Sidecar {
    pub(crate) fn new(lock_dir: &Path) -> Self {
        Sidecar {
            path: lock_dir.join(DIR),
            fd: OnceLock::new(),
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

    /// Writes the record of a holder of this process on the file `ino`, replacing `old` (its
    /// earlier record, whose acquisition time a re-save of the same file keeps). Best effort:
    /// a lock directory this user may not write in (another user's, with lock files made
    /// there before) still locks, its holders show without a record.
    pub(crate) fn write(
        &self,
        old: Option<Written>,
        ino: u64,
        record: impl FnOnce(std::time::SystemTime) -> HolderRecord,
        resource: &str,
    ) -> Option<Written> {
        let (name, at) = match old {
            Some(w) if w.ino == ino => (w.name, w.acquired_at),
            old => {
                if let Some(w) = old {
                    self.remove(&w.name);
                }
                let name = format!("{ino}.{}.{}", std::process::id(), next_number());
                (name, std::time::SystemTime::now())
            }
        };
        let dir = self.dir(true)?;
        let mut text = record(at).encode();
        text.push('\n');
        text.push_str(resource);
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW;
        let written = rustix::fs::openat(
            dir,
            name.as_str(),
            flags | OFlags::CLOEXEC,
            FileMode::from_raw_mode(0o644),
        )
        .and_then(|fd| rustix::io::write(&fd, text.as_bytes()));
        match written {
            Ok(n) if n == text.len() => Some(Written {
                name,
                ino,
                acquired_at: at,
            }),
            Ok(_) | Err(_) => {
                self.remove(&name);
                None
            }
        }
    }

    /// Removes a record (gone already is fine).
    pub(crate) fn remove(&self, name: &str) {
        if let Some(dir) = self.dir(false) {
            let _ = rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty());
        }
    }

    /// The record files there are now, by owner. Read before `/proc/locks`: a record is
    /// written after its lock is taken, so one found here whose owner the later table does not
    /// show is stale.
    pub(crate) fn scan(&self) -> Found {
        let mut found = Found::default();
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return found;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(owner) = parse(name) {
                found
                    .by_owner
                    .entry(owner)
                    .or_default()
                    .push(name.to_owned());
            }
        }
        found
    }

    /// A record and its resource; `None` for a file gone meanwhile or not ours.
    pub(crate) fn read(&self, name: &str) -> Option<(HolderRecord, String)> {
        let dir = self.dir(false)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(dir, name, flags, FileMode::empty()).ok()?;
        let mut text = vec![0u8; 4096];
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
        let text = &text[..len];
        let newline = text.iter().position(|b| *b == b'\n')?;
        let record = HolderRecord::decode(&text[..newline])?;
        let resource = String::from_utf8(text[newline + 1..].to_vec()).ok()?;
        Some((record, resource))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_written_read_replaced_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let side = Sidecar::new(dir.path());
        assert!(side.scan().by_owner.is_empty(), "no directory yet");
        let at = std::time::UNIX_EPOCH;
        let rec = |meta: &[u8]| {
            let meta = meta.to_vec();
            move |_at| HolderRecord::new(Some(meta), at)
        };
        let w = side.write(None, 7, rec(b"a"), "res\nline").unwrap();
        let me = std::process::id();
        assert_eq!(parse(&w.name), Some(Owner { ino: 7, pid: me }));
        let (r, resource) = side.read(&w.name).unwrap();
        assert_eq!(
            (r.meta.as_deref(), resource.as_str()),
            (Some(&b"a"[..]), "res\nline")
        );
        let first_at = w.acquired_at;
        let w = side.write(Some(w), 7, rec(b"b"), "res\nline").unwrap();
        assert_eq!(
            w.acquired_at, first_at,
            "a re-save keeps the acquisition time"
        );
        assert_eq!(
            side.read(&w.name).unwrap().0.meta.as_deref(),
            Some(&b"b"[..])
        );
        let mut found = side.scan();
        assert_eq!(found.take(Owner { ino: 7, pid: me }), Some(w.name.clone()));
        assert_eq!(found.take(Owner { ino: 7, pid: me }), None);
        let moved = side.write(Some(w), 8, rec(b"c"), "r").unwrap();
        let found = side.scan();
        assert_eq!(
            found.by_owner.len(),
            1,
            "the old file's record went: {found:?}"
        );
        assert_eq!(found.stale(|_| false), vec![moved.name.clone()]);
        side.remove(&moved.name);
        assert!(side.scan().by_owner.is_empty());
        assert_eq!(parse("1.2"), None);
        assert_eq!(parse("1.2.3.4"), None);
        assert_eq!(parse("x.2.3"), None);
    }
}
