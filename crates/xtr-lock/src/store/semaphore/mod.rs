//! [`SemaphoreStore`]: SysV semaphores in PHP `sysvsem`'s layout, shared with Symfony Lock's
//! `SemaphoreStore`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use md5::{Digest as _, Md5};

use super::{Acquired, Capabilities, Conflict, HandleOwner, HolderInfo, Holding, Saved, Store};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::mutex::lock;
use crate::store::LostReason;

mod counting;
mod sys;

pub use counting::counting_semaphore_key;

/// How long a blocking thread waits in the kernel before it checks whether its wait was
/// dropped. A release wakes it at once; this only bounds how long a dropped wait keeps a thread.
const STEP: Duration = Duration::from_millis(50);

/// How often an attempt opens the set again after it was removed under it (releases racing the
/// attempt) before it reports an error.
const REOPENS: usize = 1000;

/// The SysV semaphore key of `resource`, as Symfony computes it: the first four bytes of the
/// resource's MD5, read as a native-endian `i32` (PHP's `unpack('i', md5($resource, true))`).
pub fn semaphore_key(resource: &str) -> i32 {
    let digest = Md5::digest(resource.as_bytes());
    i32::from_ne_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// Locks as SysV semaphores (Linux), in the layout of PHP's `sysvsem` as Symfony Lock's
/// `SemaphoreStore` uses it, so Rust and PHP processes on one machine exclude each other.
///
/// - A resource's semaphore key is [`semaphore_key`]: the first four bytes of its MD5. Each key
///   is a set of three semaphores (the lock, a count of the processes using the set, and a guard
///   for the first user's setup), made with mode 0666 by whoever comes first.
/// - Taking the lock decrements the lock semaphore with `SEM_UNDO`: when the holder's process
///   dies, however it dies, the kernel gives the unit back and the lock is free **at once**.
/// - Releasing removes the set (`IPC_RMID`), as Symfony does: processes waiting on it wake with
///   `EIDRM` and make a new one. Where the set belongs to another user who did not let us
///   remove it, the unit is given back instead, which wakes waiters the same way.
/// - Counting semaphores are counted by the kernel: a set of two (permits free, limit) under
///   [`counting_semaphore_key`], taken in one atomic `semop` with `SEM_UNDO`, so a dead
///   holder's permits come back at once (see `docs/semaphores.md`).
/// - Waits are the kernel's: a blocked `semtimedop` on a blocking thread of the runtime, woken
///   by the release. A dropped wait returns its thread within 50 ms, giving back a lock it got
///   meanwhile.
///
/// # Guarantees
///
/// Excludes every process on this machine (in this IPC namespace) that uses the same key:
/// other tasks and threads of this process, other processes, PHP processes on Symfony's
/// `SemaphoreStore`. There are no shared locks (a read lock is exclusive, as in Symfony), no
/// expiry, no fencing tokens.
///
/// # Limits
///
/// - Keys are 32 bits of a hash: two resources whose keys collide share one lock (they exclude
///   each other without reason; neither is ever held twice). A resource whose key is 0
///   (`IPC_PRIVATE`) cannot be locked and is refused.
/// - Anyone who may alter the set can remove it (`ipcrm`): the holder finds out at its next
///   check or refresh, as a lock [removed](LostReason::Removed).
/// - Each waiting lock occupies a thread of the runtime's blocking pool.
/// - Containers with their own IPC namespace do not share locks.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::{LockFactory, Lockable as _, SemaphoreStore};
///
/// let lock = LockFactory::new(SemaphoreStore::new()).create_lock("invoice:42");
/// lock.acquire().await?;
/// let _ = lock.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SemaphoreStore {
    owner: HandleOwner,
}

impl SemaphoreStore {
    /// A store on this machine's SysV semaphores.
    pub fn new() -> Self {
        SemaphoreStore {
            owner: HandleOwner::new(),
        }
    }

    fn key_of(&self, resource: &str) -> Result<i32> {
        let id = semaphore_key(resource);
        if id == libc::IPC_PRIVATE {
            return Err(Error::invalid_argument(
                "this resource's semaphore key is 0 (IPC_PRIVATE), which no two processes can \
                 share: rename it",
            )
            .with_resource(resource)
            .with_store(self));
        }
        Ok(id)
    }

    fn error(&self, resource: &str, what: &str, err: std::io::Error) -> Error {
        Error::storage(format!("{what}: {err}"))
            .with_resource(resource)
            .with_store(self)
            .with_source(err)
    }

    async fn take(&self, key: &Key, wait: bool) -> Result<Saved> {
        let handle = key.handle::<Handle>(self.owner);
        if lock(&handle.0).is_some() {
            // Re-taken by its holder: still held if the set is still ours.
            return match self.check(key)? {
                Holding::Held(_) => Ok(Saved::Acquired(Acquired::new())),
                Holding::NotHeld(_) => Box::pin(self.take(key, wait)).await,
            };
        }
        let sem_key = self.key_of(key.resource())?;
        // A try needs no thread: every call it makes returns at once, unless another process
        // is inside the set's setup (then the thread below waits for it).
        if !wait {
            match attempt_now(sem_key) {
                Ok(Now::Taken(id)) => return Ok(self.keep(key, &handle, sem_key, id)),
                Ok(Now::Busy) => return Ok(Saved::Conflict(Conflict::new())),
                Ok(Now::SettingUp) => {}
                Err(e) => return Err(self.error(key.resource(), "semaphore", e)),
            }
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(cancel.clone());
        let task = tokio::task::spawn_blocking(move || attempt(sem_key, wait, &cancel));
        let taken = match task.await {
            Ok(taken) => taken.map_err(|e| self.error(key.resource(), "semaphore", e))?,
            Err(join) => {
                return Err(Error::storage("a semaphore's thread ended abnormally")
                    .with_resource(key.resource())
                    .with_store(self)
                    .with_source(join));
            }
        };
        let Some(taken) = taken else {
            return Ok(Saved::Conflict(Conflict::new()));
        };
        Ok(self.keep(key, &handle, sem_key, taken.keep()))
    }

    /// Records a lock taken on set `id` in the holder's handle.
    fn keep(&self, key: &Key, handle: &Handle, sem_key: i32, id: i32) -> Saved {
        *lock(&handle.0) = Some(Held { key: sem_key, id });
        // The lock belongs to this process's semaphore undo state: it cannot travel.
        key.mark_unserializable();
        Saved::Acquired(Acquired::new())
    }

    /// Whether the key's set is still the one its key names, with the lock taken. A set found
    /// gone clears the handle.
    fn check(&self, key: &Key) -> Result<Holding> {
        let Some(handle) = key.existing_handle::<Handle>(self.owner) else {
            return Ok(Holding::NotHeld(LostReason::Removed));
        };
        let mut slot = lock(&handle.0);
        let Some(Held { key: sem_key, id }) = *slot else {
            return Ok(Holding::NotHeld(LostReason::Removed));
        };
        let current = sys::existing(sem_key)
            .map_err(|e| self.error(key.resource(), "semaphore lookup", e))?;
        let held = current == Some(id)
            && match sys::is_taken(id) {
                Ok(taken) => taken,
                Err(e) if sys::is_removed(&e) => false,
                Err(e) => return Err(self.error(key.resource(), "semaphore state", e)),
            };
        if held {
            Ok(Holding::Held(Mode::Write))
        } else {
            *slot = None;
            Ok(Holding::NotHeld(LostReason::Removed))
        }
    }
}

impl Default for SemaphoreStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for SemaphoreStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("semaphore")
    }
}

impl fmt::Debug for SemaphoreStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphoreStore").finish_non_exhaustive()
    }
}

/// A holder's handle: the set whose lock it took. Dropped while holding (every clone of the
/// key gone), it releases.
#[derive(Default)]
struct Handle(std::sync::Mutex<Option<Held>>);

/// A set whose lock a holder took: its key and its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    key: i32,
    id: i32,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(held) = lock(&self.0).take() {
            release(held);
        }
    }
}

/// Releases `held` as Symfony does, by removing the set; where the set is another user's and
/// may not be removed, by giving the unit back. Whether a live lock was let go: a set that is
/// no longer the key's (removed, and another made) is not ours to touch.
fn release(held: Held) -> bool {
    if sys::existing(held.key).ok().flatten() != Some(held.id) {
        return false;
    }
    let id = held.id;
    match sys::remove(id) {
        Ok(()) => true,
        Err(e) if sys::is_not_permitted(&e) => {
            sys::give_back(id);
            true
        }
        Err(_) => false,
    }
}

/// Sets its flag when dropped: a dropped wait tells its thread to stop.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A lock a blocking thread took, on its way to the holder's handle. Dropped on the way (the
/// wait was dropped), it gives the unit back.
struct Taken(Option<i32>);

impl Taken {
    fn keep(mut self) -> i32 {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some(id) = self.0.take() {
            sys::give_back(id);
        }
    }
}

/// What a try without a thread found.
enum Now {
    Taken(i32),
    Busy,
    /// Another process is inside the set's setup: wait for it on a thread.
    SettingUp,
}

/// A try made of calls that return at once.
fn attempt_now(sem_key: i32) -> std::io::Result<Now> {
    for _ in 0..REOPENS {
        let id = match sys::open(sem_key, None, &|| true) {
            Ok(Some(id)) => id,
            Ok(None) => return Ok(Now::SettingUp),
            Err(e) if sys::is_removed(&e) => continue,
            Err(e) => return Err(e),
        };
        match sys::take(id, None) {
            Ok(true) => return Ok(Now::Taken(id)),
            Ok(false) => {
                sys::leave(id);
                return Ok(Now::Busy);
            }
            Err(e) if sys::is_removed(&e) => continue,
            Err(e) => {
                sys::leave(id);
                return Err(e);
            }
        }
    }
    Ok(Now::SettingUp)
}

/// One attempt, on a blocking thread: open the key's set and take its lock, at once or waiting
/// until `cancel`; a set removed under it (a release) is opened again.
fn attempt(sem_key: i32, wait: bool, cancel: &AtomicBool) -> std::io::Result<Option<Taken>> {
    let stop = || cancel.load(Ordering::Acquire);
    let mut reopens = 0;
    loop {
        let id = match sys::open(sem_key, Some(STEP), &stop) {
            Ok(Some(id)) => id,
            Ok(None) => return Ok(None),
            Err(e) if sys::is_removed(&e) && reopens < REOPENS => {
                reopens += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let got = loop {
            match sys::take(id, wait.then_some(STEP)) {
                Ok(true) => break Ok(true),
                Ok(false) if wait && !stop() => continue,
                Ok(false) => break Ok(false),
                Err(e) => break Err(e),
            }
        };
        match got {
            Ok(true) => return Ok(Some(Taken(Some(id)))),
            Ok(false) => {
                sys::leave(id);
                return Ok(None);
            }
            Err(e) if sys::is_removed(&e) && reopens < REOPENS => {
                reopens += 1;
                if stop() {
                    return Ok(None);
                }
            }
            Err(e) => {
                sys::leave(id);
                return Err(e);
            }
        }
    }
}

#[async_trait]
impl Store for SemaphoreStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: true,
            shared: false,
            blocking: true,
            blocking_shared: false,
            expiring: false,
            fencing: false,
            notifies: false,
            serializable_keys: false,
            introspection: true,
            liveness: true,
            observes_loss: false,
            leased: false,
            counting: true,
            metadata: false,
            lists: false,
            fair: false,
        }
    }

    /// Every store on this machine (its IPC namespace) shares the same semaphores.
    fn locks_in(&self) -> Option<String> {
        Some("semaphore".to_owned())
    }

    /// The set's key as `ipcs -s` shows it: `SysV semaphore key 0x1a2b3c4d`.
    fn location(&self, resource: &str) -> Option<String> {
        Some(format!(
            "SysV semaphore key {:#010x}",
            semaphore_key(resource) as u32
        ))
    }

    /// Takes the lock if it is free, without waiting; a holder that already holds keeps it.
    /// The ttl is ignored (semaphores do not expire).
    async fn save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        if let Some(permits) = key.permits() {
            return self.sem_take(key, permits, false).await;
        }
        self.take(key, false).await
    }

    /// Waits in the kernel until the lock is taken; woken by the release (or by the holder's
    /// death).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting, its thread stops within 50 ms and gives back a lock
    /// it took meanwhile; nothing stays held or counted in.
    async fn wait_and_save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        if let Some(permits) = key.permits() {
            return self.sem_take(key, permits, true).await;
        }
        self.take(key, true).await
    }

    /// Checks that the holder's set is still there with its lock taken (nothing expires).
    async fn put_off_expiration(&self, key: &Key, _ttl: Duration) -> Result<Holding> {
        self.exists(key).await
    }

    /// Removes the holder's set (waiters wake and make a new one). `false` when it held nothing
    /// or its set was already gone.
    async fn delete(&self, key: &Key) -> Result<bool> {
        if key.permits().is_some() {
            return Ok(self.sem_delete(key));
        }
        let Some(handle) = key.existing_handle::<Handle>(self.owner) else {
            return Ok(false);
        };
        let Some(held) = lock(&handle.0).take() else {
            return Ok(false);
        };
        Ok(release(held))
    }

    /// The holder's set, checked against the key's current set.
    async fn exists(&self, key: &Key) -> Result<Holding> {
        if key.permits().is_some() {
            return self.sem_check(key);
        }
        self.check(key)
    }

    /// A counting semaphore's permits in use and its limit (no holders: the kernel does not
    /// say who holds a semaphore's units).
    async fn usage(&self, key: &Key) -> Result<crate::Usage> {
        if key.permits().is_none() {
            return Ok(crate::Usage::default());
        }
        self.sem_usage(key)
    }

    fn why_not_listing(&self) -> String {
        "SysV semaphore sets are keyed by a hash of the name, so names cannot be enumerated \
         (nor metadata kept)"
            .to_owned()
    }

    /// The holder of `resource`'s semaphore, with its process (the last process that changed
    /// the lock semaphore, which is the holder while it is held).
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let sem_key = self.key_of(resource)?;
        let Some(id) =
            sys::existing(sem_key).map_err(|e| self.error(resource, "semaphore lookup", e))?
        else {
            return Ok(Vec::new());
        };
        let found = sys::is_taken(id).and_then(|taken| Ok(taken.then_some(sys::last_pid(id)?)));
        match found {
            Ok(Some(pid)) => Ok(vec![HolderInfo::new(
                Mode::Write,
                u32::try_from(pid).ok().filter(|p| *p > 0),
                None,
            )]),
            Ok(None) => Ok(Vec::new()),
            Err(e) if sys::is_removed(&e) => Ok(Vec::new()),
            Err(e) => Err(self.error(resource, "semaphore state", e)),
        }
    }
}
