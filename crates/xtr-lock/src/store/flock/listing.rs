//! Who holds what in a lock directory: holders of one file (`/proc/locks` with the holders'
//! records), the listing of the whole directory, and observers' change notifications.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirEntryExt as _, MetadataExt as _};

use super::FlockStore;
use super::dir::shown;
use super::limit::LimitFile;
use super::name::{self, Digest, semaphore_channel};
use super::proc_locks::{self, FlockEntry};
use super::records::{Found, Owner};
use crate::error::{Error, Result};
use crate::key::Mode;
use crate::meta::HolderRecord;
use crate::store::{HolderInfo, Listing, Watcher};

/// What one lock directory entry is, by its name.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// A lock file of this store's prefix: its readable part, and the resource when the name
    /// tells it exactly.
    Lock {
        readable: String,
        resource: Option<String>,
    },
    /// Slot file of the semaphore named so.
    Slot(String),
}

impl FlockStore {
    /// A consistent copy of `/proc/locks`, or the error saying why not.
    pub(super) async fn lock_table(&self, resource: &str) -> Result<String> {
        proc_locks::snapshot()
            .await
            .map_err(|e| {
                Error::storage(format!("cannot read /proc/locks: {e}"))
                    .with_resource(resource)
                    .with_store(self)
                    .with_source(e)
            })?
            .ok_or_else(|| {
                Error::storage("the kernel's lock table (/proc/locks) changed during every read")
                    .temporary()
                    .with_resource(resource)
                    .with_store(self)
            })
    }

    /// The processes holding `resource`'s file, their modes, and the records of ours.
    pub(super) async fn holders_of(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let path = self.path_for(resource);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(
                    Error::storage(format!("cannot stat lock file {}: {e}", shown(&path)))
                        .with_resource(resource)
                        .with_store(self)
                        .with_source(e),
                );
            }
        };
        let table = self.lock_table(resource).await?;
        let dev = meta.dev();
        let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
        let entries = proc_locks::granted(&table, major, minor, meta.ino());
        let pids = entries.iter().filter_map(|e| e.pid).collect();
        let mut found = self.inner.hub.records().read(&pids, false);
        let (holders, _) = with_records(&mut found, meta.ino(), &entries);
        Ok(holders)
    }

    /// Every held lock file of this store's prefix and every held semaphore in the directory
    /// whose resource starts with `prefix` (see [`list`](crate::Store::list)).
    pub(super) async fn list_files(&self, prefix: &str) -> Result<Vec<Listing>> {
        let dir = &self.inner.dir;
        let fail = |what: &str, e: std::io::Error| {
            Error::storage(format!("cannot {what} lock directory {}: {e}", shown(dir)))
                .with_store(self)
                .with_source(e)
        };
        let dev = std::fs::metadata(dir).map_err(|e| fail("stat", e))?.dev();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| fail("read", e))? {
            let entry = entry.map_err(|e| fail("read", e))?;
            if let Some(name) = entry.file_name().to_str() {
                files.push((name.to_owned(), entry.ino()));
            }
        }
        let table = self.lock_table(prefix).await?;
        let held = proc_locks::by_inode(&table, rustix::fs::major(dev), rustix::fs::minor(dev));
        let pids = held.values().flatten().filter_map(|e| e.pid).collect();
        // The files of processes that are gone (killed holders') are removed on the way.
        let mut found = self.inner.hub.records().read(&pids, true);
        let mut out = Vec::new();
        let mut slots: BTreeMap<String, Vec<(u64, FlockEntry)>> = BTreeMap::new();
        for (file, ino) in files {
            let Some(entries) = held.get(&ino) else {
                continue;
            };
            match self.kind(&file) {
                Some(Kind::Slot(sem)) if sem.starts_with(prefix) => {
                    // A permit is an exclusive lock on a slot: one holder per slot.
                    let writer = entries.iter().find(|e| e.mode == Mode::Write);
                    slots
                        .entry(sem)
                        .or_default()
                        .extend(writer.map(|e| (ino, *e)));
                }
                Some(Kind::Lock { readable, resource }) => {
                    let (holders, recorded) = with_records(&mut found, ino, entries);
                    let named = |r: &String| {
                        [Digest::Short, Digest::Long]
                            .iter()
                            .any(|d| name::file_name(&self.inner.prefix, r, *d) == file)
                    };
                    let resource = resource.or(recorded.filter(named));
                    let shown = match resource {
                        Some(r) => r.starts_with(prefix).then_some(r),
                        // Nobody of ours holds it and its name is not its resource: shown
                        // under the file's name, wherever the resource may start so.
                        None => name::may_start_with(&readable, prefix).then_some(file),
                    };
                    out.extend(shown.map(|r| Listing::lock(r, holders)));
                }
                _ => {}
            }
        }
        for (sem, held_slots) in slots {
            let limit = match LimitFile::locked(dir, &sem, false).await {
                Ok(f) => f.read().ok().flatten().unwrap_or(0),
                Err(_) => 0,
            };
            let holders = slot_holders(&mut found, &held_slots);
            out.push(Listing::semaphore(sem, limit, holders));
        }
        Ok(out)
    }

    /// An observer's notification: acquisitions in this process and releases by anyone
    /// (closes of the file, seen through inotify). Acquisitions by other processes make no
    /// event the store can see (an open is not yet a lock), so it is best effort.
    pub(super) fn changes_of(&self, resource: &str) -> Watcher {
        // The name may be a lock's or a semaphore's: watched as both.
        let hub = &self.inner.hub;
        let mut lock = hub.subscribe_changes(&self.file_name(resource));
        let mut sem = hub.subscribe_changes(&semaphore_channel(resource));
        Watcher::best_effort(async move {
            tokio::select! {
                () = lock.changed() => {}
                () = sem.changed() => {}
            }
        })
    }

    /// What a directory entry is, by its name: a semaphore's slot file (portalocker's
    /// `{name}.{NN}.lock`), or one of this store's lock files, with its resource when the
    /// name's readable part is the whole resource (its digest then matches).
    fn kind(&self, file: &str) -> Option<Kind> {
        let stem = file.strip_suffix(".lock")?;
        let (front, last) = stem.rsplit_once('.')?;
        if (2..=3).contains(&last.len()) && last.bytes().all(|b| b.is_ascii_digit()) {
            return Some(Kind::Slot(front.to_owned()));
        }
        let readable = front.strip_prefix(self.inner.prefix.as_str())?;
        let digest = match last.len() {
            7 => Digest::Short,
            43 => Digest::Long,
            _ => return None,
        };
        let exact = name::file_name(&self.inner.prefix, readable, digest) == file;
        Some(Kind::Lock {
            readable: readable.to_owned(),
            resource: exact.then(|| readable.to_owned()),
        })
    }
}

/// The holders of file `ino` as the table lists them, each with the record of ours that
/// matches (by process; a process holding the file twice has two), and the resource a record
/// names.
fn with_records(
    found: &mut Found,
    ino: u64,
    entries: &[FlockEntry],
) -> (Vec<HolderInfo>, Option<String>) {
    let mut resource = None;
    let holders = entries
        .iter()
        .map(|e| {
            let record = e
                .pid
                .and_then(|pid| found.take(Owner { ino, pid }))
                .map(|(record, r)| {
                    resource.get_or_insert(r);
                    record
                });
            HolderInfo::new(e.mode, e.pid, None).with_record(record)
        })
        .collect();
    (holders, resource)
}

/// A semaphore's holders, one per process with the permits (slots) it holds, each with the
/// first record of that process on one of its slots.
pub(super) fn slot_holders(found: &mut Found, held: &[(u64, FlockEntry)]) -> Vec<HolderInfo> {
    let mut by_pid: BTreeMap<Option<u32>, (u32, Option<HolderRecord>)> = BTreeMap::new();
    for (ino, entry) in held {
        let slot = by_pid.entry(entry.pid).or_default();
        slot.0 += 1;
        if slot.1.is_none() {
            slot.1 = entry
                .pid
                .and_then(|pid| found.take(Owner { ino: *ino, pid }))
                .map(|(record, _)| record);
        }
    }
    by_pid
        .into_iter()
        .map(|(pid, (n, record))| {
            HolderInfo::new(Mode::Write, pid, None)
                .with_permits(n)
                .with_record(record)
        })
        .collect()
}
