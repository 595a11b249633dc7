//! [`FlockStore`]: lock files with `flock(2)`, shared with Python xtr-lock and `flock(1)`.

use std::fmt;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use rand::Rng as _;

use super::{
    Acquired, Capabilities, Conflict, HandleOwner, HolderInfo, Holding, LossWatcher, LostReason,
    Saved, Store, Watcher,
};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};

pub(crate) mod config;
mod dir;
mod file;
mod limit;
mod line;
mod listing;
mod loss;
mod name;
mod proc_locks;
mod records;
mod semaphore;
mod wake;

use crate::mutex::lock;
use file::{Attempt, FileHandle, HeldFile, holding_of};
use wake::Hub;

/// The safety-net poll of a waiter, for releases no close event shows (an explicit `LOCK_UN`, a
/// demotion by another process).
const DEFAULT_POLL: Duration = Duration::from_millis(100);

/// Lock files in a directory, locked with BSD `flock(2)`: excludes tasks, threads and processes
/// on one machine, and interoperates with Python xtr-lock 4.1.0's `FlockStore` and `flock(1)` on
/// the same files.
///
/// - One file per resource, `xtr.<readable>.<digest>.lock` (the Python peer's names), empty,
///   mode 0666, **never unlinked** (unlinking a lock file safely is racy; the peers leave them
///   too). The default directory is Python's: `<tempdir>/xtr-lock-<uid>`, private (0700).
/// - One descriptor per holder per store, opened with `O_NOFOLLOW | O_CLOEXEC`; a lock planted
///   as a symlink is refused and its target untouched. The descriptor is the holder's handle on
///   its key: dropping every clone of the key closes it, which releases the lock.
/// - A lock file that is unlinked or replaced while held (someone cleaning lock files up) is a
///   **lost lock**: the holder is told at once ([`watch_loss`](Store::watch_loss), by inotify
///   name events), and `exists`, refresh, re-acquire and release compare the held descriptor's
///   inode with the path's, so two holders never both claim one name. An attempt that locked a
///   file replaced meanwhile starts over on the new one.
/// - `LOCK_EX` for writes, `LOCK_SH` for reads. Not `fcntl`/OFD locks: on Linux those do not
///   conflict with `flock`, and would silently break exclusion with the peers.
/// - Waiters are woken when the holder lets go: in this process at once, and across processes
///   by inotify close events on the directory (one thread per directory, never one per waiter),
///   with a 100 ms poll as a safety net.
/// - [`holders`](Store::holders) reads `/proc/locks`: the pid and mode of each holder.
/// - Counting semaphores in portalocker 4.4.2's `NamedBoundedSemaphore` layout, shared with it
///   both ways: slot files `{name}.{number:02d}.lock` beside the lock files, a permit being an
///   exclusive `flock` on one, and our clients' limit in `{name}.limit`; waiters are woken by
///   any of the semaphore's slot files closing (see `docs/semaphores.md`).
///
/// # Guarantees
///
/// Excludes every holder using `flock(2)` on the same file on this machine, in this process or
/// another, in Rust, Python or `flock(1)`. A crashed or killed holder's lock is free at once: the
/// kernel closes its descriptors.
///
/// **Promotion is not atomic.** Linux converts a lock by dropping the old one first. A failed
/// promotion takes the read lock back at once; if a writer got in between, the read lock is
/// reported **lost** (a refusal that kept nothing, [`Conflict::kept`] `None`: the holder is then
/// not held), never claimed. During a blocking promotion the holder keeps its read lock between
/// attempts.
///
/// # Failure modes
///
/// - Keys that used this store hold an open file and refuse to serialize
///   ([`ErrorKind::UnserializableKey`](crate::ErrorKind::UnserializableKey)), permanently.
/// - On NFS, Linux emulates `flock` with byte-range locks: the guarantees hold on local file
///   systems only.
/// - `open` and `flock` errors (other than "held") are storage errors naming the file.
/// - Lock files accumulate (one per resource ever locked, 0 bytes each); an operator may delete
///   old `xtr.*.lock` files while nothing runs.
///
/// # Clock assumptions
///
/// None: nothing expires, so ttls are ignored and [`refresh`](crate::Lockable::refresh) only checks
/// that the holder still holds.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::{FlockStore, LockFactory, Lockable as _};
///
/// let dir = std::env::temp_dir().join(format!("xtr-lock-doc-{}", std::process::id()));
/// let factory = LockFactory::new(FlockStore::in_dir(&dir)?);
/// let lock = factory.create_lock("nightly-report");
/// assert!(lock.try_acquire().await?);
/// assert!(!factory.create_lock("nightly-report").try_acquire().await?);
/// let _ = lock.release().await?;
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FlockStore {
    inner: Arc<Inner>,
}

struct Inner {
    owner: HandleOwner,
    dir: PathBuf,
    prefix: String,
    digest: name::Digest,
    poll: Duration,
    hub: Arc<Hub>,
}

impl FlockStore {
    /// A store in the default directory, `<tempdir>/xtr-lock-<uid>` (Python's), created 0700.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) when the directory
    /// cannot be made private, or is not a directory of this user (a symlink, another user's).
    pub fn new() -> Result<Self> {
        Ok(Self::build(dir::default_dir()?))
    }

    /// A store in `dir`, created (0700, parents too) when missing. An existing directory must be
    /// a real directory (not a symlink), writable, owned by this user or by root, and neither it
    /// nor a parent may belong to another user or be writable by every user without being sticky
    /// (the rules OpenSSH applies to its key files): so a directory root made for several users,
    /// `/var/lock/app` with mode 1777 or 2775, shares its locks between them, and nobody else can
    /// replace the lock files. Its mode is left alone, so its owner may open it to a group. A
    /// relative path is resolved once, now.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming the directory and
    /// what is wrong with it.
    pub fn in_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Ok(Self::build(dir::explicit_dir(dir.as_ref())?))
    }

    fn build(dir: PathBuf) -> Self {
        let hub = Hub::for_dir(&dir);
        FlockStore {
            inner: Arc::new(Inner {
                owner: HandleOwner::new(),
                dir,
                prefix: name::XTR_PREFIX.to_owned(),
                digest: name::Digest::Short,
                poll: DEFAULT_POLL,
                hub,
            }),
        }
    }

    fn rebuilt(&self, prefix: String, digest: name::Digest, poll: Duration) -> Self {
        FlockStore {
            inner: Arc::new(Inner {
                owner: HandleOwner::new(),
                dir: self.inner.dir.clone(),
                prefix,
                digest,
                poll,
                hub: self.inner.hub.clone(),
            }),
        }
    }

    /// Uses another file-name prefix: `sf.` shares locks with Symfony's `FlockStore` (in a
    /// directory both use). The default, `xtr.`, shares them with Python xtr-lock.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) unless the prefix is 1
    /// to 16 characters of `[A-Za-z0-9._-]`.
    pub fn with_file_prefix(&self, prefix: &str) -> Result<Self> {
        let ok = !prefix.is_empty()
            && prefix.len() <= 16
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && prefix != "."
            && prefix != "..";
        if !ok {
            return Err(Error::invalid_argument(
                "a lock file prefix must be 1 to 16 characters of [A-Za-z0-9._-]",
            ));
        }
        Ok(self.rebuilt(prefix.to_owned(), self.inner.digest, self.inner.poll))
    }

    /// Names lock files with the whole SHA-256 of the resource (43 characters) instead of the
    /// peers' 7 (42 bits), so no two resources ever share a lock file. The peers' names are
    /// kept by default: with 7 characters, two resources whose readable parts (the first 50
    /// characters, folded) are equal share a file with odds of about n²/2⁴³ among n such
    /// resources, and someone who picks resource names can find such a pair in seconds. Use
    /// this in deployments without Python or PHP processes on the same directory: they would
    /// not see these files. DSN: `flock:///dir?names=long`.
    pub fn with_long_names(&self) -> Self {
        self.rebuilt(
            self.inner.prefix.clone(),
            name::Digest::Long,
            self.inner.poll,
        )
    }

    /// Sets the safety-net poll of waiters (default 100 ms), for releases that no close event
    /// shows: an explicit `LOCK_UN` or a demotion by another process. Waiters are woken by
    /// releases in this process, and by other processes closing the file, whatever this is.
    pub fn with_poll_interval(&self, poll: Duration) -> Self {
        self.rebuilt(
            self.inner.prefix.clone(),
            self.inner.digest,
            poll.max(Duration::from_millis(1)),
        )
    }

    /// The directory of the lock files (absolute).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The lock file of `resource`.
    pub fn path_for(&self, resource: &str) -> PathBuf {
        self.inner.dir.join(self.file_name(resource))
    }

    fn file_name(&self, resource: &str) -> String {
        name::file_name(&self.inner.prefix, resource, self.inner.digest)
    }

    /// The holder's lock file, locked for the caller: made (unopened) on first use.
    fn held<'k>(&self, handle: &'k FileHandle, key: &Key) -> MutexGuard<'k, Option<HeldFile>> {
        let mut slot = lock(handle);
        if slot.is_none() {
            *slot = Some(HeldFile::new(
                self.file_name(key.resource()),
                self.inner.hub.clone(),
            ));
        }
        slot
    }

    /// One non-blocking attempt to hold `key`'s file in `mode`. With `keep_fd`, a descriptor
    /// opened for the attempt stays open after a conflict (a waiter retries on it).
    fn attempt(&self, key: &Key, mode: Mode, keep_fd: bool) -> Result<Saved> {
        let handle = key.handle::<FileHandle>(self.inner.owner);
        let attempt = {
            let mut slot = self.held(&handle, key);
            let held = slot.as_mut().expect("made by held()");
            let before = held.mode;
            let attempt = held
                .try_lock(&self.inner.dir, mode, keep_fd)
                .map_err(|e| e.with_resource(key.resource()).with_store(self))?;
            if matches!(attempt, Attempt::Locked) {
                held.keep_record(key);
                if before != Some(mode) {
                    self.inner.hub.acquired(&held.name);
                }
            }
            attempt
        };
        Ok(match attempt {
            Attempt::Locked => {
                key.mark_unserializable();
                Saved::Acquired(Acquired::new())
            }
            Attempt::Conflict { kept } => Saved::Conflict(Conflict::new().with_kept(kept)),
        })
    }

    async fn wait_save(&self, key: &Key, mode: Mode) -> Result<Saved> {
        let name = self.file_name(key.resource());
        // Dropped while waiting, close the descriptor this wait opened.
        let _close_on_drop = CloseIfWaiting {
            key,
            owner: self.inner.owner,
        };
        let held_before = self.local_mode(key);
        let mut tries = 0u32;
        // A free lock costs a blocking acquire what a `try` costs: the directory is watched
        // only after a refusal, and the attempt right after it sees a close in between.
        let mut changed = None;
        let mut place: Option<line::Place> = None; // behind this process's earlier waiters
        loop {
            let turn = place
                .as_ref()
                .map_or_else(|| self.may_pass_the_line(key, mode), line::Place::turn);
            match turn.then(|| self.attempt(key, mode, true)).transpose()? {
                Some(Saved::Acquired(a)) => return Ok(Saved::Acquired(a)),
                // The holder lost the read lock it was promoting: the wait cannot go on.
                Some(Saved::Conflict(c)) if c.kept.is_none() && held_before.is_some() => {
                    return Ok(Saved::Conflict(c));
                }
                _ => {}
            }
            let Some(changed) = changed.as_mut() else {
                changed = Some(self.inner.hub.subscribe(&name));
                place = held_before
                    .is_none()
                    .then(|| self.join_the_line(&name, mode));
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

    /// The mode the holder's file is locked in, as this process last left it (no check).
    fn local_mode(&self, key: &Key) -> Option<Mode> {
        let handle = key.existing_handle::<FileHandle>(self.inner.owner)?;
        let slot = lock(&handle);
        slot.as_ref().and_then(|f| f.mode)
    }

    /// What the holder holds, checked against the file the name leads to now.
    fn verify(&self, key: &Key) -> Result<Holding> {
        let handle = key.existing_handle::<FileHandle>(self.inner.owner);
        holding_of(handle.as_deref(), &self.inner.dir)
            .map_err(|e| e.with_resource(key.resource()).with_store(self))
    }

    /// How long a waiter sleeps before trying again if nothing wakes it. With close events
    /// observed, the poll is only a safety net; without them, Python's backoff (10, 20, 40, 80,
    /// then 100 ms, each × 1.00–1.10).
    fn backoff(&self, tries: u32) -> Duration {
        backoff(
            self.inner.hub.observes_other_processes(),
            self.inner.poll,
            tries,
        )
    }
}

fn backoff(observed: bool, poll: Duration, tries: u32) -> Duration {
    let mut rng = rand::rng();
    if observed {
        return poll.mul_f64(rng.random_range(0.9..=1.1));
    }
    let base = Duration::from_millis(10u64 << tries.min(4))
        .min(Duration::from_millis(100))
        .min(poll);
    base.mul_f64(1.0 + f64::from(rng.random_range(0..=10u8)) / 100.0)
}

/// Closes a descriptor that a dropped wait left open without a lock on it.
struct CloseIfWaiting<'a> {
    key: &'a Key,
    owner: HandleOwner,
}

impl Drop for CloseIfWaiting<'_> {
    fn drop(&mut self) {
        if let Some(handle) = self.key.existing_handle::<FileHandle>(self.owner) {
            let mut slot = lock(&handle);
            if slot.as_ref().is_some_and(|h| h.mode.is_none()) {
                *slot = None;
            }
        }
    }
}

impl fmt::Display for FlockStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "flock://{}", self.inner.dir.display())
    }
}

impl fmt::Debug for FlockStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlockStore")
            .field("dir", &self.inner.dir)
            .field("prefix", &self.inner.prefix)
            .field("poll", &self.inner.poll)
            .field("inotify", &self.inner.hub.observes_if_known())
            .finish()
    }
}

#[async_trait]
impl Store for FlockStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: true,
            shared: true,
            blocking: true,
            blocking_shared: true,
            expiring: false,
            fencing: false,
            notifies: true,
            serializable_keys: false,
            introspection: true,
            liveness: true,
            observes_loss: true,
            leased: false,
            counting: true,
            metadata: true,
            lists: true,
            fair: false,
        }
    }

    /// The directory (resolved, so two spellings of one directory compare equal) and the
    /// file-name prefix.
    fn location(&self, resource: &str) -> Option<String> {
        Some(self.path_for(resource).display().to_string())
    }

    fn locks_in(&self) -> Option<String> {
        let dir = std::fs::canonicalize(&self.inner.dir).unwrap_or_else(|_| self.inner.dir.clone());
        Some(format!(
            "flock://{}?prefix={}",
            dir.display(),
            self.inner.prefix
        ))
    }

    async fn save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        if let Some(permits) = key.permits() {
            let mut sweep = semaphore::Sweep::default();
            return self.sem_attempt(key, permits, &mut sweep).await;
        }
        self.attempt_in_line(key, Mode::Write)
    }

    async fn save_read(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        super::refuse_shared_permits(key)?;
        self.attempt_in_line(key, Mode::Read)
    }

    /// Waits for the write lock: woken by releases in this process and by other processes
    /// closing the file, polling every 100 ms as a safety net. Holds no thread.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it holds nothing new and closes the descriptor it
    /// opened; a holder that held a read lock keeps it.
    async fn wait_and_save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        if let Some(permits) = key.permits() {
            return self.sem_wait(key, permits).await;
        }
        self.wait_save(key, Mode::Write).await
    }

    /// Waits for a read lock, as [`wait_and_save`](FlockStore::wait_and_save) does.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it holds nothing new and closes the descriptor it
    /// opened.
    async fn wait_and_save_read(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        super::refuse_shared_permits(key)?;
        self.wait_save(key, Mode::Read).await
    }

    /// Checks that the holder still holds, on the file its name leads to (nothing expires
    /// here).
    async fn put_off_expiration(&self, key: &Key, _ttl: Duration) -> Result<Holding> {
        self.exists(key).await
    }

    /// Unlocks and closes the holder's descriptor; the handle keeps only the file's name, for
    /// the next acquire. The file stays. A file unlinked or renamed over meanwhile was not held:
    /// `false`.
    async fn delete(&self, key: &Key) -> Result<bool> {
        if key.permits().is_some() {
            return Ok(self.sem_delete(key));
        }
        let Some(handle) = key.existing_handle::<FileHandle>(self.inner.owner) else {
            return Ok(false);
        };
        let mut slot = lock(&handle);
        Ok(slot.as_mut().is_some_and(HeldFile::release))
    }

    /// The holder's own state, checked against the file the name leads to now (the kernel keeps
    /// a `flock` lock for as long as the descriptor is open, so there is nothing else to ask).
    /// A replaced file is let go of and reported as [`LostReason::Replaced`].
    async fn exists(&self, key: &Key) -> Result<Holding> {
        if key.permits().is_some() {
            return self.sem_verify(key);
        }
        self.verify(key)
    }

    /// A best-effort watcher: releases in this process and closes by other processes.
    async fn watch(&self, key: &Key, _waiting_since: SystemTime) -> Result<Option<Watcher>> {
        if key.permits().is_some() {
            return Ok(Some(self.sem_watch(key)));
        }
        let mut changed = self.inner.hub.subscribe(&self.file_name(key.resource()));
        Ok(Some(Watcher::best_effort(async move {
            changed.changed().await;
        })))
    }

    /// Completes when the holder's lock file is unlinked or replaced, or when the holder let go
    /// of it: the file's inode is compared with the path's every 100 ms for the first second,
    /// then at each inotify name event on the directory (once a second where inotify cannot
    /// tell). The replaced file is let go of.
    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        if key.permits().is_some() {
            return Ok(Some(self.sem_watch_loss(key)));
        }
        // Weak: the watcher must not keep the holder's file open after the key goes.
        let handle = key.existing_handle::<FileHandle>(self.inner.owner);
        let handle = handle.as_ref().map(Arc::downgrade);
        let dir = self.inner.dir.clone();
        let name = self.file_name(key.resource());
        let check = move || lost_reason(handle.as_ref(), &dir);
        Ok(Some(loss::watcher(self.inner.hub.clone(), name, check)))
    }

    /// A duplicate of the holder's locked descriptor: a child that inherits it holds the lock
    /// for as long as it keeps it open, as under `flock(1)`.
    ///
    /// # Errors
    ///
    /// A storage error when the descriptor cannot be duplicated.
    fn inheritable_descriptors(&self, key: &Key) -> Result<Option<Vec<OwnedFd>>> {
        if key.permits().is_some() {
            return self.sem_descriptors(key);
        }
        let Some(handle) = key.existing_handle::<FileHandle>(self.inner.owner) else {
            return Ok(None);
        };
        let slot = lock(&handle);
        let Some(fd) = slot
            .as_ref()
            .filter(|f| f.mode.is_some())
            .and_then(HeldFile::fd)
        else {
            return Ok(None);
        };
        let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| {
            Error::storage(format!("cannot duplicate the lock file's descriptor: {e}"))
                .with_resource(key.resource())
                .with_store(self)
                .with_source(std::io::Error::from(e))
        })?;
        Ok(Some(vec![dup]))
    }

    /// Permits held now: the slots `0..limit` locked (by us, portalocker or anyone), grouped by
    /// process; the limit our clients stored, while any slot is held.
    async fn usage(&self, key: &Key) -> Result<crate::Usage> {
        match key.permits() {
            Some(permits) => self.sem_usage(key, permits).await,
            None => Ok(crate::Usage::default()),
        }
    }

    /// The processes holding the file and their modes, from a consistent read of `/proc/locks`
    /// (a temporary error when the kernel's lock table changed during every read), with the
    /// metadata and acquisition time of ours (their records).
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        self.holders_of(resource).await
    }

    /// The held lock files of this store's prefix and the held semaphores, from the directory
    /// and `/proc/locks`: `flock(1)`'s and the peers' holders too, with pids. A lock file whose
    /// name does not tell its resource (a name longer than 50 characters, or with characters
    /// outside `[A-Za-z0-9._-]`) is listed under its resource while one of our holders (its
    /// record) names it, else under its file name.
    async fn list(&self, prefix: &str) -> Result<Vec<super::Listing>> {
        self.list_files(prefix).await
    }

    /// Wakes on acquisitions in this process and on releases by anyone (closes seen through
    /// inotify); another process's acquisition is not seen, so observers also poll.
    async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
        Ok(Some(self.changes_of(resource)))
    }
}

/// Why the holder whose handle `handle` points to no longer holds its lock file, if it does
/// not. A stat that fails says nothing about the lock: look again at the next event.
fn lost_reason(handle: Option<&std::sync::Weak<FileHandle>>, dir: &Path) -> Option<LostReason> {
    let handle = handle.and_then(std::sync::Weak::upgrade);
    match holding_of(handle.as_deref(), dir) {
        Ok(Holding::NotHeld(reason)) => Some(reason),
        Ok(Holding::Held(_)) | Err(_) => None,
    }
}

#[cfg(test)]
mod tests;
