//! Counting semaphores on the flock store, in portalocker 4.4.2's `BoundedSemaphore` layout:
//! slot files `{name}.{number:02d}.lock` (numbers from 0 to limit − 1) in the store's
//! directory, a permit being an exclusive `flock` on one of them, plus our clients' limit in
//! `{name}.limit` ([`LimitFile`]). See `docs/semaphores.md`.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};

use super::file::HeldFile;
use super::limit::LimitFile;
use super::listing::slot_holders;
use super::name::{MAX_SEMAPHORE_NAME, semaphore_channel, slot_name};
use super::proc_locks::FlockEntry;
use super::{FlockStore, loss, proc_locks};
use crate::error::{Error, LostReason, Result};
use crate::key::{Key, Mode};
use crate::mutex::lock;
use crate::permits::Permits;
use crate::store::{Acquired, Conflict, Holding, LossWatcher, Saved, Usage, Watcher};

/// What a semaphore's holder keeps on its key: the slot files it holds.
#[derive(Default)]
pub(super) struct Slots {
    files: Vec<HeldFile>,
    /// A slot file held was found replaced (and every slot let go of): said until it holds
    /// again.
    replaced: bool,
}

type SlotsHandle = Mutex<Slots>;

impl Slots {
    /// What the holder holds, each slot checked against the file its name leads to now; one
    /// found replaced lets go of them all.
    fn holding(&mut self, dir: &std::path::Path) -> Result<Holding> {
        if self.files.is_empty() {
            let reason = if self.replaced {
                LostReason::Replaced
            } else {
                LostReason::Removed
            };
            return Ok(Holding::NotHeld(reason));
        }
        for file in &mut self.files {
            if let Holding::NotHeld(reason) = file.holding(dir)? {
                self.files.clear();
                self.replaced = reason == LostReason::Replaced;
                return Ok(Holding::NotHeld(reason));
            }
        }
        Ok(Holding::Held(Mode::Write))
    }
}

/// The slot files of one sweep, opened once: a waiter keeps them open between attempts, so its
/// attempts make no close events that would wake the other waiters. Dropped, they close.
#[derive(Default)]
pub(super) struct Sweep(Vec<HeldFile>);

impl Sweep {
    /// Lets go of every slot this sweep locked, keeping the descriptors.
    fn unlock_all(&mut self) {
        self.0.iter_mut().for_each(HeldFile::unlock_quietly);
    }
}

impl FlockStore {
    /// The semaphore's name as portalocker's `name`: the resource itself, which must fit in a
    /// file name.
    fn semaphore_name<'k>(&self, key: &'k Key) -> Result<&'k str> {
        let name = key.resource();
        if name.contains(['/', '\0']) || name.len() > MAX_SEMAPHORE_NAME {
            return Err(Error::invalid_argument(format!(
                "a flock semaphore's name is part of its slot files' names: it may not contain \
                 '/' or NUL, nor be longer than {MAX_SEMAPHORE_NAME} bytes"
            ))
            .with_resource(name)
            .with_store(self));
        }
        Ok(name)
    }

    fn in_context(&self, key: &Key, err: Error) -> Error {
        err.with_resource(key.resource()).with_store(self)
    }

    /// One attempt to take `permits.count()` slots, on the descriptors of `sweep` (opened as
    /// needed). A holder that holds already still holds.
    pub(super) async fn sem_attempt(
        &self,
        key: &Key,
        permits: Permits,
        sweep: &mut Sweep,
    ) -> Result<Saved> {
        let name = self.semaphore_name(key)?;
        let handle = key.handle::<SlotsHandle>(self.inner.owner);
        {
            let mut slots = lock(&handle);
            if !slots.files.is_empty() && slots.holding(&self.inner.dir)?.is_held() {
                // A re-save replaces the metadata, keeping when it acquired.
                if let Some(first) = slots.files.first_mut() {
                    first.keep_record(key);
                }
                return Ok(Saved::Acquired(Acquired::new()));
            }
        }
        let limit_file = LimitFile::locked(&self.inner.dir, name, true)
            .await
            .map_err(|e| self.in_context(key, e))?;
        let stored = limit_file.read().map_err(|e| self.in_context(key, e))?;
        if let Some(stored) = stored.filter(|s| *s != permits.limit())
            && !self.held_slots(name, stored).await?.is_empty()
        {
            return Err(permits.limit_mismatch(name, stored).with_store(self));
        }
        let taken = self
            .take_slots(name, permits, sweep)
            .and_then(|taken| {
                if taken && stored != Some(permits.limit()) {
                    limit_file.write(permits.limit())?;
                }
                Ok(taken)
            })
            .inspect_err(|_| sweep.unlock_all())
            .map_err(|e| self.in_context(key, e))?;
        drop(limit_file);
        if !taken {
            return Ok(Saved::Conflict(Conflict::new()));
        }
        let mut held: Vec<HeldFile> = std::mem::take(&mut sweep.0)
            .into_iter()
            .filter(HeldFile::is_locked)
            .collect();
        // One record per holder, on its first slot.
        if let Some(first) = held.first_mut() {
            first.keep_record(key);
        }
        *lock(&handle) = Slots {
            files: held,
            replaced: false,
        };
        self.inner.hub.acquired(&semaphore_channel(name));
        key.mark_unserializable();
        Ok(Saved::Acquired(Acquired::new()))
    }

    /// Waits for the permits: woken when a slot file of the semaphore is let go of (in this
    /// process at once, by another process through inotify close events), polling as the lock
    /// waiters do as a safety net. Holds no thread.
    ///
    /// Cancel-safe: dropped, it closes the slot files it opened and holds nothing new.
    pub(super) async fn sem_wait(&self, key: &Key, permits: Permits) -> Result<Saved> {
        let mut sweep = Sweep::default();
        let mut changed = None;
        let mut tries = 0u32;
        loop {
            if let Saved::Acquired(a) = self.sem_attempt(key, permits, &mut sweep).await? {
                return Ok(Saved::Acquired(a));
            }
            // Subscribed after a refusal, then tried once more: no release in between is missed.
            let Some(changed) = changed.as_mut() else {
                let channel = semaphore_channel(key.resource());
                changed = Some(self.inner.hub.subscribe(&channel));
                continue;
            };
            let nap = self.backoff(tries);
            tries = tries.saturating_add(1);
            tokio::select! {
                () = changed.changed() => {}
                () = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// Locks free slots in portalocker's order (0 first) until `count` are held: whether they
    /// were. Refused, it holds none of them again.
    fn take_slots(&self, name: &str, permits: Permits, sweep: &mut Sweep) -> Result<bool> {
        let limit = permits.limit() as usize;
        for number in sweep.0.len()..limit {
            let file = HeldFile::new(slot_name(name, number as u32), self.inner.hub.clone());
            sweep.0.push(file);
        }
        let mut taken = 0;
        for file in &mut sweep.0[..limit] {
            if taken == permits.count() {
                break;
            }
            if matches!(
                file.try_lock(&self.inner.dir, Mode::Write, true)?,
                super::file::Attempt::Locked
            ) {
                taken += 1;
            }
        }
        if taken < permits.count() {
            sweep.unlock_all();
            return Ok(false);
        }
        Ok(true)
    }

    /// The slots among `0..upto` that someone holds, with who (a consistent read of
    /// `/proc/locks`).
    async fn held_slots(&self, name: &str, upto: u32) -> Result<Vec<(u64, FlockEntry)>> {
        use std::os::unix::fs::MetadataExt as _;
        let mut files = Vec::new();
        for number in 0..upto {
            match std::fs::symlink_metadata(self.inner.dir.join(slot_name(name, number))) {
                Ok(meta) => files.push((meta.dev(), meta.ino())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::storage(format!("cannot stat a slot file: {e}"))
                        .with_resource(name)
                        .with_store(self)
                        .with_source(e));
                }
            }
        }
        if files.is_empty() {
            return Ok(Vec::new());
        }
        let table = proc_locks::snapshot().await.ok().flatten().ok_or_else(|| {
            Error::storage("cannot read a consistent /proc/locks")
                .temporary()
                .with_resource(name)
                .with_store(self)
        })?;
        Ok(files
            .into_iter()
            .flat_map(|(dev, ino)| {
                let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
                proc_locks::granted(&table, major, minor, ino)
                    .into_iter()
                    .filter(|e| e.mode == Mode::Write)
                    .take(1)
                    .map(move |e| (ino, e))
            })
            .collect())
    }

    /// Permits held now (slots `0..max(stored limit, the key's)`), grouped by process.
    pub(super) async fn sem_usage(&self, key: &Key, permits: Permits) -> Result<Usage> {
        let name = self.semaphore_name(key)?;
        let stored = LimitFile::locked(&self.inner.dir, name, false)
            .await
            .and_then(|f| f.read())
            .map_err(|e| self.in_context(key, e))?;
        let upto = stored.unwrap_or(0).max(permits.limit());
        let held = self.held_slots(name, upto).await?;
        let pids = held.iter().filter_map(|(_, e)| e.pid).collect();
        let mut found = self.inner.hub.records().read(&pids, false);
        let used = u32::try_from(held.len()).unwrap_or(u32::MAX);
        Ok(Usage {
            used,
            limit: stored.filter(|_| used > 0),
            holders: slot_holders(&mut found, &held),
        })
    }

    /// What the holder holds, each slot checked against the file its name leads to now.
    pub(super) fn sem_verify(&self, key: &Key) -> Result<Holding> {
        let Some(handle) = key.existing_handle::<SlotsHandle>(self.inner.owner) else {
            return Ok(Holding::NotHeld(LostReason::Removed));
        };
        let held = lock(&handle).holding(&self.inner.dir);
        held.map_err(|e| self.in_context(key, e))
    }

    /// Lets go of every slot the holder holds: whether it held them all, on files that still
    /// have their names.
    pub(super) fn sem_delete(&self, key: &Key) -> bool {
        let Some(handle) = key.existing_handle::<SlotsHandle>(self.inner.owner) else {
            return false;
        };
        let files = std::mem::take(&mut lock(&handle).files);
        let held = !files.is_empty();
        files
            .into_iter()
            .fold(held, |all, mut file| file.release() && all)
    }

    /// Wakes when a slot file of the semaphore is let go of (in this process, or closed by
    /// another).
    pub(super) fn sem_watch(&self, key: &Key) -> Watcher {
        let mut changed = self.inner.hub.subscribe(&semaphore_channel(key.resource()));
        Watcher::best_effort(async move {
            changed.changed().await;
        })
    }

    /// Completes when a slot file the holder holds is unlinked or replaced, or it let go.
    pub(super) fn sem_watch_loss(&self, key: &Key) -> LossWatcher {
        let handle = key.existing_handle::<SlotsHandle>(self.inner.owner);
        let handle: Option<Weak<SlotsHandle>> = handle.as_ref().map(Arc::downgrade);
        let dir = self.inner.dir.clone();
        let check = move || {
            let handle = handle.as_ref().and_then(Weak::upgrade)?;
            match lock(&handle).holding(&dir) {
                Ok(Holding::NotHeld(reason)) => Some(reason),
                Ok(Holding::Held(_)) | Err(_) => None,
            }
        };
        loss::watcher(
            self.inner.hub.clone(),
            semaphore_channel(key.resource()),
            check,
        )
    }

    /// Duplicates of the holder's locked slot descriptors: a child that inherits them holds
    /// the permits for as long as it keeps them open.
    pub(super) fn sem_descriptors(&self, key: &Key) -> Result<Option<Vec<OwnedFd>>> {
        let Some(handle) = key.existing_handle::<SlotsHandle>(self.inner.owner) else {
            return Ok(None);
        };
        let slots = lock(&handle);
        let mut out = Vec::with_capacity(slots.files.len());
        for fd in slots.files.iter().filter_map(HeldFile::fd) {
            let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| {
                Error::storage(format!("cannot duplicate a slot file's descriptor: {e}"))
                    .with_source(std::io::Error::from(e))
            });
            out.push(dup.map_err(|e| self.in_context(key, e))?);
        }
        Ok((!out.is_empty()).then_some(out))
    }
}
