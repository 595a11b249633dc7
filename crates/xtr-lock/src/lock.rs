//! [`Lock`]: what users hold.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng as _;

use crate::Lockable;
use crate::clock::Clock;
use crate::error::{Error, ErrorKind, Result, ShownResource};
use crate::guard::{LockGuard, schedule_cleanup};
use crate::keepalive::KeepAlive;
use crate::key::{Key, Mode};
use crate::store::{Acquired, Capabilities, Store, check_expiry};

/// The log target of this crate.
pub(crate) const TARGET: &str = "xtr_lock";

/// What [`Lock::release`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The holder held the lock and now does not.
    Released,
    /// The holder held nothing and was not believed to: never acquired, or already released.
    NotHeld,
    /// The holder believed it held the lock, but the store had nothing of it: the lock expired,
    /// or was taken over after expiring. Work done since it was lost was not protected.
    Lost,
}

impl Release {
    /// Whether the holder held the lock until this release.
    pub fn was_held(self) -> bool {
        self == Release::Released
    }
}

/// An exclusive or shared lock on one resource, held by one [`Key`] in one [`Store`].
///
/// Made by a [`LockFactory`](crate::LockFactory). Clones, and locks built from the same key, are
/// one holder: acquiring what it already holds succeeds at once, and one release lets go for all.
///
/// # Waiting
///
/// Blocking acquires use the store's native wait when it has one. Otherwise they retry after each
/// conflict, woken by the store's change notification when it has one (a release by anyone the
/// store can observe), at the moment the current holders' lifetimes end when the store tells it,
/// and otherwise by polling every 90–110 ms (random, on the lock's clock). They never give up by
/// themselves: use the `*_timeout` forms or drop the future.
///
/// # Cancellation
///
/// Dropping an acquire future (for example through [`tokio::time::timeout`]) leaves nothing
/// held: if the holder did not hold the lock when the acquire began, a delete of what the store
/// may already have stored is scheduled on the runtime and runs to completion, before any later
/// store operation of the same holder. If the holder held it before (re-acquire, promotion,
/// demotion), nothing is deleted.
///
/// # Lifetimes
///
/// On expiring stores the lock's ttl goes into the save itself; the key's deadline is measured
/// from just before the successful attempt, so a wait of any length ends with a full lease. A
/// lock whose lifetime ran out before the store confirmed is taken back and reported as
/// [`ErrorKind::Expired`], never as held.
#[derive(Clone)]
pub struct Lock {
    key: Key,
    store: Arc<dyn Store>,
    ttl: Option<Duration>,
}

impl Lock {
    /// A lock for `key` in `store`; a `ttl` of `None` or zero means no lifetime.
    pub fn new(key: Key, store: Arc<dyn Store>, ttl: Option<Duration>) -> Self {
        Lock {
            key,
            store,
            ttl: ttl.filter(|t| !t.is_zero()),
        }
    }

    /// The same holder with another ttl (`None` or zero: no lifetime).
    pub fn with_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl.filter(|t| !t.is_zero());
        self
    }

    /// The holder.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The resource.
    pub fn resource(&self) -> &str {
        self.key.resource()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The lifetime each acquisition gets, if any.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    fn clock(&self) -> &Arc<dyn Clock> {
        self.key.clock()
    }

    // ---- acquire ---------------------------------------------------------------------------

    /// Tries once to take the write lock.
    ///
    /// Returns `Ok(false)` when someone else holds it (logged at info). A reader that is the
    /// sole reader is promoted; a reader that is not keeps its read lock and gets `Ok(false)`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Expired`] if the lifetime ran out before the store confirmed (taken back);
    /// [`ErrorKind::Acquiring`] with the store's error as source for any other failure.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held (see the type's docs).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
    /// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
    /// let lock = factory.create_lock("nightly-report");
    /// if lock.try_acquire().await? {
    ///     // ... the work only one worker may do ...
    ///     lock.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self) -> Result<bool> {
        self.acquire_mode(Mode::Write, false).await
    }

    /// Waits until the write lock is taken. Never gives up by itself.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Lock::try_acquire); only conflicts are retried, any other error ends
    /// the wait. A conflict from a native wait is returned unchanged.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
    /// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
    /// let lock = factory.create_lock("subscription:42");
    /// lock.acquire().await?;
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self) -> Result<()> {
        self.acquire_mode(Mode::Write, true).await.map(|_| ())
    }

    /// Waits up to `wait` (on the lock's clock) for the write lock; `Ok(false)` if it did not
    /// come in time.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Lock::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: on timeout or drop it leaves nothing held.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<bool> {
        self.with_deadline(wait, self.acquire_mode(Mode::Write, true))
            .await
    }

    /// Tries once to take a read lock (shared with other readers). A writer that asks is
    /// demoted. On a store without shared locks this takes the write lock instead (logged at
    /// debug).
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Lock::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    pub async fn try_acquire_read(&self) -> Result<bool> {
        self.acquire_mode(Mode::Read, false).await
    }

    /// Waits until a read lock is taken. Never gives up by itself.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Lock::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    pub async fn acquire_read(&self) -> Result<()> {
        self.acquire_mode(Mode::Read, true).await.map(|_| ())
    }

    /// Waits up to `wait` for a read lock; `Ok(false)` if it did not come in time.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Lock::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: on timeout or drop it leaves nothing held.
    pub async fn acquire_read_timeout(&self, wait: Duration) -> Result<bool> {
        self.with_deadline(wait, self.acquire_mode(Mode::Read, true))
            .await
    }

    async fn with_deadline(
        &self,
        wait: Duration,
        acquire: impl Future<Output = Result<bool>>,
    ) -> Result<bool> {
        let timeout = self.clock().sleep(wait);
        tokio::select! {
            biased;
            r = acquire => r,
            () = timeout => {
                tracing::info!(target: TARGET, resource = self.resource(), wait = ?wait,
                    "gave up waiting for the lock");
                Ok(false)
            }
        }
    }

    async fn acquire_mode(&self, asked: Mode, blocking: bool) -> Result<bool> {
        let caps = self.store.capabilities();
        let mode = if asked == Mode::Read && !caps.shared {
            tracing::debug!(target: TARGET, resource = self.resource(),
                "store does not support read locks, falling back to a write lock");
            Mode::Write
        } else {
            asked
        };
        let mut guard = CancelGuard::new(&self.key, &self.store);
        let native = blocking
            && match mode {
                Mode::Write => caps.blocking,
                Mode::Read => caps.blocking_shared,
            };
        let outcome = if native {
            self.native_wait(mode, &mut guard).await
        } else {
            self.retry_loop(mode, blocking, caps, &mut guard).await
        };
        match outcome {
            Ok(true) => {
                guard.disarm();
                self.settle(mode).await.map(|()| true)
            }
            Ok(false) => {
                guard.disarm();
                tracing::info!(target: TARGET, resource = self.resource(),
                    "failed to acquire the lock, someone else holds it");
                Ok(false)
            }
            Err(err) if err.is_conflict() => {
                // Only a native wait's conflict gets here: nothing was stored, and `record` has
                // already set what the holder still holds (a kept read lock, or nothing).
                guard.disarm();
                tracing::info!(target: TARGET, resource = self.resource(),
                    "failed to acquire the lock, someone else holds it");
                Err(err)
            }
            Err(err) if err.is_expired() => {
                // The store already took it back.
                guard.disarm();
                self.key.mark_still_held(false);
                Err(err)
            }
            Err(err) => {
                // The guard stays armed: whatever the failed save may have stored is taken back
                // (DEF-1) before this holder's next store operation.
                if err.is_lost_hold() {
                    self.key.mark_still_held(false);
                }
                tracing::warn!(target: TARGET, resource = self.resource(), error = %err,
                    "failed to acquire the lock");
                Err(Error::wrap(
                    ErrorKind::Acquiring,
                    self.resource(),
                    "failed to acquire the lock",
                    err,
                ))
            }
        }
    }

    /// One save attempt, under the holder's turn. `Ok(false)` on a conflict.
    async fn attempt(&self, mode: Mode, guard: &mut CancelGuard<'_>) -> Result<Option<Error>> {
        let _turn = self.key.turn().await;
        guard.at_attempt();
        // A waiter's lifetime starts with the attempt that wins, never earlier (DEF-7).
        let before = self.key.deadline();
        self.key.reset_lifetime();
        let saved = match mode {
            Mode::Write => self.store.save(&self.key, self.ttl).await,
            Mode::Read => self.store.save_read(&self.key, self.ttl).await,
        };
        if saved.as_ref().is_err_and(|e| !e.is_expired()) {
            // Not granted: a holder that held keeps the lease the store knows.
            self.key.restore_deadline(before);
        }
        self.record(mode, saved)
    }

    fn record(&self, mode: Mode, saved: Result<Acquired>) -> Result<Option<Error>> {
        match saved {
            Ok(acquired) => {
                self.key.mark_acquired(mode, acquired.fencing_token);
                Ok(None)
            }
            Err(err) if err.is_conflict() => {
                // A failed promotion keeps the read lock (DEF-2): the believed state stays,
                // unless the store says the read lock went too.
                if err.is_lost_hold() {
                    tracing::warn!(target: TARGET, resource = self.resource(), error = %err,
                        "the lock was lost while trying to change its mode");
                    self.key.mark_still_held(false);
                } else if self.key.held() != Some(Mode::Read) {
                    self.key.mark_still_held(false);
                }
                Ok(Some(err))
            }
            Err(err) => Err(err),
        }
    }

    async fn retry_loop(
        &self,
        mode: Mode,
        blocking: bool,
        caps: Capabilities,
        guard: &mut CancelGuard<'_>,
    ) -> Result<bool> {
        loop {
            // Registered before the attempt, so a release right after a conflict is not missed.
            let watcher = if blocking && caps.notifies {
                self.store.watch(self.resource()).await?
            } else {
                None
            };
            let Some(conflict) = self.attempt(mode, guard).await? else {
                return Ok(true);
            };
            if !blocking {
                return Ok(false);
            }
            // However quickly a watcher fires, give the scheduler (and a caller's deadline) a
            // turn between attempts: a wait must never spin without yielding.
            tokio::task::yield_now().await;
            tracing::debug!(target: TARGET, resource = self.resource(), "waiting for the lock");
            // Sleep until the holders' lifetimes end, if the store said when; poll unless the
            // watcher sees every release.
            let poll = match &watcher {
                Some(w) if w.sees_every_release() => None,
                _ => Some(Duration::from_millis(rand::rng().random_range(90..=110))),
            };
            let sleep = match (conflict.retry_after(), poll) {
                (Some(hint), Some(poll)) => Some(hint.min(poll)),
                (hint, poll) => hint.or(poll),
            };
            match (watcher, sleep) {
                (Some(watcher), Some(d)) => {
                    tokio::select! {
                        () = watcher => {}
                        () = self.clock().sleep(d) => {}
                    }
                }
                (Some(watcher), None) => watcher.await,
                (None, Some(d)) => self.clock().sleep(d).await,
                (None, None) => unreachable!("without a watcher the lock always polls"),
            }
        }
    }

    async fn native_wait(&self, mode: Mode, guard: &mut CancelGuard<'_>) -> Result<bool> {
        // Native waits are not run under the holder's turn: a pending wait must never block a
        // release or refresh of the same holder (DEF-10).
        guard.at_attempt();
        self.key.reset_lifetime();
        let saved = match mode {
            Mode::Write => self.store.wait_and_save(&self.key, self.ttl).await,
            Mode::Read => self.store.wait_and_save_read(&self.key, self.ttl).await,
        };
        match self.record(mode, saved)? {
            None => Ok(true),
            Some(conflict) => Err(conflict),
        }
    }

    /// After a successful save: the lifetime check of the Lock (the store made its own).
    async fn settle(&self, mode: Mode) -> Result<()> {
        if let Err(err) = check_expiry(self.store.as_ref(), &self.key).await {
            self.key.mark_still_held(false);
            return Err(err);
        }
        match mode {
            Mode::Write => tracing::debug!(target: TARGET, resource = self.resource(),
                fencing_token = self.key.fencing_token(), "acquired the lock"),
            Mode::Read => tracing::debug!(target: TARGET, resource = self.resource(),
                "acquired the lock for reading"),
        }
        Ok(())
    }

    // ---- refresh, release, queries ---------------------------------------------------------

    /// Extends the lifetime to `ttl` from now, or to the lock's ttl when `ttl` is `None`. On
    /// stores without expiry it only checks that the holder still holds.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::InvalidArgument`] when there is no duration (no argument, no lock ttl),
    ///   [`ErrorKind::InvalidTtl`] for a zero duration; both before any store call;
    /// - [`ErrorKind::Conflict`], unchanged from the store, when the holder no longer holds
    ///   (never acquired, released, expired, taken over); the holder is then marked not held;
    /// - [`ErrorKind::Expired`] if the new lifetime ran out before the store confirmed;
    /// - [`ErrorKind::Acquiring`] ("failed to define an expiration") for anything else.
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves the lock held, with either its old or its new lifetime.
    pub async fn refresh(&self, ttl: Option<Duration>) -> Result<()> {
        let Some(ttl) = ttl.or(self.ttl) else {
            return Err(Error::invalid_argument(
                "a refresh needs an expiration duration: pass one, or give the lock a ttl",
            )
            .with_resource(self.resource()));
        };
        if ttl.is_zero() {
            return Err(Error::invalid_ttl(ttl).with_resource(self.resource()));
        }
        let result = {
            let _turn = self.key.turn().await;
            let before = self.key.deadline();
            self.key.reset_lifetime();
            let result = self.store.put_off_expiration(&self.key, ttl).await;
            if result.as_ref().is_err_and(|e| !e.is_expired()) {
                // Not confirmed: the lease the store knows is still the old one.
                self.key.restore_deadline(before);
            }
            result
        };
        match result {
            Ok(()) => {
                self.key.mark_still_held(true);
                if let Err(err) = check_expiry(self.store.as_ref(), &self.key).await {
                    self.key.mark_still_held(false);
                    return Err(err);
                }
                tracing::debug!(target: TARGET, resource = self.resource(), ttl = ?ttl,
                    "expiration defined for the lock");
                Ok(())
            }
            Err(err) if err.is_conflict() => {
                self.key.mark_still_held(false);
                tracing::warn!(target: TARGET, resource = self.resource(),
                    "failed to define an expiration for the lock, someone else holds it");
                Err(err)
            }
            Err(err) if err.is_expired() => {
                self.key.mark_still_held(false);
                Err(err)
            }
            Err(err) => {
                tracing::warn!(target: TARGET, resource = self.resource(), error = %err,
                    "failed to define an expiration for the lock");
                Err(Error::wrap(
                    ErrorKind::Acquiring,
                    self.resource(),
                    "failed to define an expiration",
                    err,
                ))
            }
        }
    }

    /// Releases the lock, in either mode, for every task and lock of this holder.
    ///
    /// Succeeds when there is nothing to release; the [`Release`] tells what was found,
    /// including a lock that had been lost (expired, taken over) while believed held. Never
    /// touches another holder's lock.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Releasing`] with the store's error as source.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped mid-flight, the lock may or may not have been released. Use a
    /// [`LockGuard`], whose drop schedules the release, when the caller may be cancelled.
    pub async fn release(&self) -> Result<Release> {
        let believed = self.key.held().is_some();
        let deleted = {
            let _turn = self.key.turn().await;
            self.store.delete(&self.key).await
        };
        match deleted {
            Ok(removed) => {
                self.key.mark_still_held(false);
                tracing::debug!(target: TARGET, resource = self.resource(), "released the lock");
                Ok(if removed || !self.store.capabilities().excludes {
                    Release::Released
                } else if believed {
                    Release::Lost
                } else {
                    Release::NotHeld
                })
            }
            Err(err) => {
                tracing::warn!(target: TARGET, resource = self.resource(), "failed to release the lock");
                if err.kind() == ErrorKind::Releasing {
                    Err(err)
                } else {
                    Err(Error::wrap(
                        ErrorKind::Releasing,
                        self.resource(),
                        "failed to release the lock",
                        err,
                    ))
                }
            }
        }
    }

    /// Asks the store whether this holder holds the lock (either mode), and remembers the
    /// answer. Read-only on the store.
    ///
    /// # Errors
    ///
    /// The store's error, unchanged.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing on the store.
    pub async fn is_acquired(&self) -> Result<bool> {
        let held = {
            let _turn = self.key.turn().await;
            self.store.exists(&self.key).await?
        };
        self.key.mark_still_held(held);
        Ok(held)
    }

    /// Whether the lifetime has run out (local: read from the key).
    pub fn is_expired(&self) -> bool {
        self.key.is_expired()
    }

    /// The lifetime left (local: read from the key); `None` without one.
    pub fn remaining_lifetime(&self) -> Option<Duration> {
        self.key.remaining_lifetime()
    }

    /// The fencing token of the current exclusive acquisition, where the store gives one: a
    /// number greater than that of every earlier exclusive acquisition of this resource. Pass it
    /// to downstream systems so they can refuse a stale holder's writes.
    pub fn fencing_token(&self) -> Option<u64> {
        self.key.fencing_token()
    }

    /// The mode this holder believes it holds the lock in (local: updated by every call).
    pub fn held_mode(&self) -> Option<Mode> {
        self.key.held()
    }

    // ---- guards and scopes -----------------------------------------------------------------

    /// Waits for the write lock and returns a guard that releases it.
    ///
    /// If this holder already held the lock, the guard leaves it held when it goes (nesting).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Lock::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    pub async fn lock(&self) -> Result<LockGuard> {
        let took = self.key.held().is_none();
        self.acquire().await?;
        Ok(LockGuard::new(self.clone(), took))
    }

    /// Waits for the write lock, runs `body`, and releases the lock on the way out, also when
    /// the body fails, panics or is cancelled, unless this holder already held the lock when the
    /// scope began (nesting).
    ///
    /// The body's error wins over a release error, which is then logged at warn; a release
    /// error after a successful body is returned. A lock lost during the body (expired, taken
    /// over) is left alone on exit.
    ///
    /// # Errors
    ///
    /// The acquire's or the release's error converted into `E`, or the body's error.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it leaves nothing held; dropped while the body runs, a
    /// release is scheduled on the runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
    /// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
    /// let lock = factory.create_lock("cache-warmup");
    /// let n = lock.scoped(async { Ok::<_, xtr_lock::Error>(42) }).await?;
    /// assert_eq!(n, 42);
    /// assert!(!lock.is_acquired().await?);
    /// # Ok(()) }
    /// ```
    pub async fn scoped<T, E, F>(&self, body: F) -> std::result::Result<T, E>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let guard = self.lock().await?;
        guard.run(body).await
    }

    /// Starts renewing this lock in the background at a third of its ttl, until it is released
    /// or the returned [`KeepAlive`] is dropped, and tells when the lock is lost (a refresh
    /// found it taken over, or the store stayed unreachable until the lease ran out). Call it
    /// once the lock is held.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a lock without a ttl; [`ErrorKind::Unsupported`]
    /// outside a tokio runtime.
    pub fn keep_alive(&self) -> Result<KeepAlive> {
        KeepAlive::start(self)
    }

    /// Schedules a release of what this holder holds, ordered before its next store operation.
    pub(crate) fn release_in_background(&self) {
        schedule_cleanup(
            self.key.clone(),
            self.store.clone(),
            self.key.acquisitions(),
            "dropped guard",
        );
    }
}

/// Takes back what a dropped acquire may have stored.
struct CancelGuard<'a> {
    key: &'a Key,
    store: &'a Arc<dyn Store>,
    armed: bool,
    acquisitions: u64,
}

impl<'a> CancelGuard<'a> {
    fn new(key: &'a Key, store: &'a Arc<dyn Store>) -> Self {
        CancelGuard {
            key,
            store,
            // A holder that held before the acquire began keeps what it had (CAN-2).
            armed: key.held().is_none(),
            acquisitions: key.acquisitions(),
        }
    }

    /// Called under the turn before each store attempt: only what happens from here on is ours
    /// to take back.
    fn at_attempt(&mut self) {
        self.acquisitions = self.key.acquisitions();
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            schedule_cleanup(
                self.key.clone(),
                self.store.clone(),
                self.acquisitions,
                "cancelled or failed acquire",
            );
        }
    }
}

impl fmt::Display for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Lock({}, {})",
            ShownResource(self.resource()),
            self.store
        )
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("store", &format_args!("{}", self.store))
            .field("ttl", &self.ttl)
            .finish()
    }
}

#[async_trait]
impl Lockable for Lock {
    fn resource(&self) -> &str {
        Lock::resource(self)
    }
    async fn try_acquire(&self) -> Result<bool> {
        Lock::try_acquire(self).await
    }
    async fn acquire(&self) -> Result<()> {
        Lock::acquire(self).await
    }
    async fn acquire_timeout(&self, wait: Duration) -> Result<bool> {
        Lock::acquire_timeout(self, wait).await
    }
    async fn try_acquire_read(&self) -> Result<bool> {
        Lock::try_acquire_read(self).await
    }
    async fn acquire_read(&self) -> Result<()> {
        Lock::acquire_read(self).await
    }
    async fn acquire_read_timeout(&self, wait: Duration) -> Result<bool> {
        Lock::acquire_read_timeout(self, wait).await
    }
    async fn refresh(&self, ttl: Option<Duration>) -> Result<()> {
        Lock::refresh(self, ttl).await
    }
    async fn release(&self) -> Result<Release> {
        Lock::release(self).await
    }
    async fn is_acquired(&self) -> Result<bool> {
        Lock::is_acquired(self).await
    }
    fn is_expired(&self) -> bool {
        Lock::is_expired(self)
    }
    fn remaining_lifetime(&self) -> Option<Duration> {
        Lock::remaining_lifetime(self)
    }
    fn fencing_token(&self) -> Option<u64> {
        Lock::fencing_token(self)
    }
    fn is_believed_held(&self) -> bool {
        self.key.held().is_some()
    }
    fn release_in_background(&self) {
        Lock::release_in_background(self);
    }
}
