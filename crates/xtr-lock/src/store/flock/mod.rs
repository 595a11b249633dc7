//! [`FlockStore`]: lock files with `flock(2)`, shared with Python xtr-lock and `flock(1)`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng as _;

use rustix::io::Errno;

use super::{Acquired, Capabilities, HolderInfo, Store, Watcher};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};

mod dir;
mod file;
mod name;
mod proc_locks;
mod wake;

use dir::shown;
use file::{HeldFile, open_lock_file, operation};
use wake::Hub;

/// Each store instance keeps its own descriptor per holder: state on the key is keyed by this.
static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

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
///   as a symlink is refused and its target untouched.
/// - `LOCK_EX` for writes, `LOCK_SH` for reads. Not `fcntl`/OFD locks: on Linux those do not
///   conflict with `flock`, and would silently break exclusion with the peers.
/// - Waiters are woken when the holder lets go: in this process at once, and across processes
///   by inotify close events on the directory (one thread per directory, never one per waiter),
///   with a 100 ms poll as a safety net.
/// - [`holders`](Store::holders) reads `/proc/locks`: the pid and mode of each holder.
///
/// # Guarantees
///
/// Excludes every holder using `flock(2)` on the same file on this machine, in this process or
/// another, in Rust, Python or `flock(1)`. A crashed or killed holder's lock is free at once: the
/// kernel closes its descriptors.
///
/// **Promotion is not atomic.** Linux converts a lock by dropping the old one first. A failed
/// promotion takes the read lock back at once; if a writer got in between, the read lock is
/// reported **lost** (a conflict with [`Error::is_lost_hold`], and the holder is then not held),
/// never claimed. During a blocking promotion the holder keeps its read lock between attempts.
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
/// None: nothing expires, so ttls are ignored and [`refresh`](crate::Lock::refresh) only checks
/// that the holder still holds.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::{FlockStore, LockFactory};
///
/// let dir = std::env::temp_dir().join(format!("xtr-lock-doc-{}", std::process::id()));
/// let factory = LockFactory::new(FlockStore::in_dir(&dir)?);
/// let lock = factory.create_lock("nightly-report");
/// assert!(lock.try_acquire().await?);
/// assert!(!factory.create_lock("nightly-report").try_acquire().await?);
/// lock.release().await?;
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FlockStore {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    dir: PathBuf,
    prefix: String,
    poll: Duration,
    hub: Arc<Hub>,
}

/// What one non-blocking attempt found.
enum Outcome {
    Locked,
    /// Someone else holds it; what this holder held before is kept.
    Conflict,
    /// Someone else holds it, and this holder lost what it held before.
    LostHold,
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
    /// a real directory of this user and writable; its mode is left alone, so its owner may open
    /// it to a group to share locks. A relative path is resolved once, now.
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
                id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
                dir,
                prefix: name::XTR_PREFIX.to_owned(),
                poll: DEFAULT_POLL,
                hub,
            }),
        }
    }

    fn rebuilt(&self, prefix: String, poll: Duration) -> Self {
        FlockStore {
            inner: Arc::new(Inner {
                id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
                dir: self.inner.dir.clone(),
                prefix,
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
        Ok(self.rebuilt(prefix.to_owned(), self.inner.poll))
    }

    /// Sets the safety-net poll of waiters (default 100 ms), for releases that no close event
    /// shows: an explicit `LOCK_UN` or a demotion by another process. Waiters are woken by
    /// releases in this process, and by other processes closing the file, whatever this is.
    pub fn with_poll_interval(&self, poll: Duration) -> Self {
        self.rebuilt(
            self.inner.prefix.clone(),
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
        name::file_name(&self.inner.prefix, resource)
    }

    /// One non-blocking attempt to hold `key`'s file in `mode`. With `keep_fd`, a descriptor
    /// opened for the attempt stays open after a conflict (a waiter retries on it).
    fn attempt(&self, key: &Key, mode: Mode, keep_fd: bool) -> Result<Outcome> {
        let outcome = key.with_local_state::<HeldFile, _>(self.inner.id, |slot| {
            let held = slot.get_or_insert_with(|| HeldFile {
                name: self.file_name(key.resource()),
                fd: None,
                mode: None,
                hub: self.inner.hub.clone(),
            });
            if held.mode == Some(mode) {
                return Ok(Outcome::Locked); // already held in this mode: no system call
            }
            let path = || self.inner.dir.join(&held.name);
            if held.fd.is_none() {
                let fd = open_lock_file(&path())
                    .map_err(|e| e.with_resource(key.resource()).with_store(self))?;
                held.fd = Some(fd);
            }
            let fd = held.fd.as_ref().expect("opened above");
            let before = held.mode;
            match rustix::fs::flock(fd, operation(mode)) {
                Ok(()) => {
                    held.mode = Some(mode);
                    if before == Some(Mode::Write) {
                        // A demotion lets waiting readers in.
                        self.inner.hub.notify(&held.name);
                    }
                    Ok(Outcome::Locked)
                }
                Err(Errno::WOULDBLOCK) => match before {
                    None => {
                        if !keep_fd {
                            held.close();
                        }
                        Ok(Outcome::Conflict)
                    }
                    // Linux dropped the old lock before failing to convert it: take it back.
                    Some(old) => match rustix::fs::flock(fd, operation(old)) {
                        Ok(()) => Ok(Outcome::Conflict),
                        Err(_) => {
                            held.mode = None;
                            held.close();
                            Ok(Outcome::LostHold)
                        }
                    },
                },
                Err(errno) => {
                    let lost = before.is_some();
                    let path = path();
                    held.close();
                    let err = Error::storage(format!("cannot lock {}: {errno}", shown(&path)))
                        .with_resource(key.resource())
                        .with_store(self)
                        .with_source(std::io::Error::from(errno));
                    Err(if lost { err.with_lost_hold() } else { err })
                }
            }
        })?;
        if matches!(outcome, Outcome::Locked) {
            key.mark_unserializable();
        }
        Ok(outcome)
    }

    fn conflict(&self, key: &Key, outcome: &Outcome) -> Error {
        let err = Error::conflict(key.resource()).with_store(self);
        match outcome {
            Outcome::LostHold => err
                .with_reason(
                    "the lock held before was lost: flock cannot change a lock's mode atomically",
                )
                .with_lost_hold(),
            _ => err,
        }
    }

    fn try_save(&self, key: &Key, mode: Mode) -> Result<Acquired> {
        match self.attempt(key, mode, false)? {
            Outcome::Locked => Ok(Acquired::new()),
            other => Err(self.conflict(key, &other)),
        }
    }

    async fn wait_save(&self, key: &Key, mode: Mode) -> Result<Acquired> {
        let name = self.file_name(key.resource());
        // Dropped while waiting, close the descriptor this wait opened (CAN-4).
        let _close_on_drop = CloseIfWaiting {
            key,
            store: self.inner.id,
        };
        let mut tries = 0u32;
        loop {
            let changed = self.inner.hub.subscribe(&name);
            let outcome = self.attempt(key, mode, true)?;
            match outcome {
                Outcome::Locked => return Ok(Acquired::new()),
                Outcome::LostHold => return Err(self.conflict(key, &outcome)),
                Outcome::Conflict => {}
            }
            let nap = self.nap(tries);
            tries = tries.saturating_add(1);
            let mut changed = changed;
            tokio::select! {
                _ = changed.changed() => {}
                () = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// How long a waiter sleeps before trying again if nothing wakes it. With close events
    /// observed, the poll is only a safety net; without them, Python's backoff (10, 20, 40, 80,
    /// then 100 ms, each × 1.00–1.10).
    fn nap(&self, tries: u32) -> Duration {
        nap(
            self.inner.hub.observes_other_processes(),
            self.inner.poll,
            tries,
        )
    }
}

fn nap(observed: bool, poll: Duration, tries: u32) -> Duration {
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
    store: u64,
}

impl Drop for CloseIfWaiting<'_> {
    fn drop(&mut self) {
        self.key
            .with_local_state::<HeldFile, _>(self.store, |slot| {
                if slot.as_ref().is_some_and(|h| h.mode.is_none()) {
                    *slot = None;
                }
            });
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
            .field("inotify", &self.inner.hub.observes_other_processes())
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
        }
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: it completes at its first poll (non-blocking system calls).
    async fn save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Acquired> {
        self.try_save(key, Mode::Write)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: it completes at its first poll (non-blocking system calls).
    async fn save_read(&self, key: &Key, _ttl: Option<Duration>) -> Result<Acquired> {
        self.try_save(key, Mode::Read)
    }

    /// Waits for the write lock: woken by releases in this process and by other processes
    /// closing the file, polling every 100 ms as a safety net. Holds no thread.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it holds nothing new and closes the descriptor it
    /// opened; a holder that held a read lock keeps it.
    async fn wait_and_save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Acquired> {
        self.wait_save(key, Mode::Write).await
    }

    /// Waits for a read lock, as [`wait_and_save`](FlockStore::wait_and_save) does.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it holds nothing new and closes the descriptor it
    /// opened.
    async fn wait_and_save_read(&self, key: &Key, _ttl: Option<Duration>) -> Result<Acquired> {
        self.wait_save(key, Mode::Read).await
    }

    /// Checks that the holder still holds (nothing expires here).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: local state only.
    async fn put_off_expiration(&self, key: &Key, _ttl: Duration) -> Result<()> {
        if self.exists(key).await? {
            Ok(())
        } else {
            Err(Error::conflict(key.resource()).with_store(self))
        }
    }

    /// Unlocks and closes the holder's descriptor. The file stays.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it completes at its first poll.
    async fn delete(&self, key: &Key) -> Result<bool> {
        Ok(key.with_local_state::<HeldFile, _>(self.inner.id, |slot| {
            slot.as_mut().is_some_and(HeldFile::close)
        }))
    }

    /// From this holder's own state: the kernel keeps a `flock` lock for as long as the
    /// descriptor is open, so there is nothing to ask.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: local state only.
    async fn exists(&self, key: &Key) -> Result<bool> {
        Ok(key.with_local_state::<HeldFile, _>(self.inner.id, |slot| {
            slot.as_ref().is_some_and(|h| h.mode.is_some())
        }))
    }

    /// A best-effort watcher: releases in this process and closes by other processes.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: registration is synchronous.
    async fn watch(&self, resource: &str) -> Result<Option<Watcher>> {
        let mut changed = self.inner.hub.subscribe(&self.file_name(resource));
        Ok(Some(Watcher::best_effort(async move {
            let _ = changed.changed().await;
        })))
    }

    /// The processes holding the file and their modes, from `/proc/locks`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: read-only.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
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
        let locks = std::fs::read_to_string("/proc/locks").map_err(|e| {
            Error::storage(format!("cannot read /proc/locks: {e}"))
                .with_resource(resource)
                .with_store(self)
                .with_source(e)
        })?;
        use std::os::unix::fs::MetadataExt as _;
        let dev = meta.dev();
        let entries = proc_locks::granted(
            &locks,
            rustix::fs::major(dev),
            rustix::fs::minor(dev),
            meta.ino(),
        );
        Ok(entries
            .into_iter()
            .map(|e| HolderInfo::new(e.mode, e.pid, None))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_close_events_waiters_back_off_like_the_python_peer() {
        let ms = |x: f64| Duration::from_secs_f64(x / 1000.0);
        let bounds = [
            (10.0, 11.0),
            (20.0, 22.0),
            (40.0, 44.0),
            (80.0, 88.0),
            (100.0, 110.0),
            (100.0, 110.0),
        ];
        for _ in 0..200 {
            for (tries, (lo, hi)) in bounds.iter().enumerate() {
                let d = nap(false, DEFAULT_POLL, tries as u32);
                assert!(d >= ms(*lo) && d <= ms(*hi), "try {tries}: {d:?}");
            }
        }
    }

    #[test]
    fn with_close_events_the_poll_is_only_a_safety_net() {
        for tries in 0..10 {
            let d = nap(true, DEFAULT_POLL, tries);
            assert!(
                d >= Duration::from_millis(90) && d <= Duration::from_millis(110),
                "{d:?}"
            );
        }
    }
}
