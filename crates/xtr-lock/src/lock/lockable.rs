//! [`Lockable`]: the API of a lock, implemented by [`Lock`](crate::Lock) and [`NoLock`], with
//! [`Wait`] and [`Release`].

use std::time::Duration;

use async_trait::async_trait;

use super::lost::KeepAlive;
use crate::error::{LostReason, Result};
use crate::key::Mode;

/// How long an acquire waits for a lock held by someone else. One meaning in the library and
/// the `xtr-lock` command:
///
/// | `Wait` | `xtr-lock` | |
/// |---|---|---|
/// | [`Never`](Wait::Never) | `-n` | try once |
/// | [`AtMost(d)`](Wait::AtMost) | `-w d` | wait up to `d` (`AtMost(ZERO)` tries once) |
/// | [`Forever`](Wait::Forever), the default | neither | wait until it comes |
///
/// A wait is at most [`MAX_DURATION`](crate::MAX_DURATION); a longer `AtMost` is refused as an invalid argument.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Wait {
    /// Try once.
    Never,
    /// Wait up to this long, on the lock's clock.
    AtMost(Duration),
    /// Wait until the lock comes (a caller may still drop the future).
    #[default]
    Forever,
}

/// What a release found.
///
/// `#[must_use]`: a release can find that the lock had been lost meanwhile
/// ([`Release::Lost`]), and then the work done since was not protected. Check it
/// ([`was_held`](Release::was_held)), or say that it does not matter with `let _ =`:
///
/// ```
/// # #![deny(unused_must_use)]
/// # async fn work(lock: &xtr_lock::Lock) -> xtr_lock::Result<()> {
/// use xtr_lock::Lockable as _;
/// if !lock.release().await?.was_held() {
///     // Lost before the release: the work was not protected.
/// }
/// let _ = lock.release().await?; // nothing to release any more
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # #![deny(unused_must_use)]
/// # async fn work(lock: &xtr_lock::Lock) -> xtr_lock::Result<()> {
/// use xtr_lock::Lockable as _;
/// lock.release().await?; // unused `Release` that must be used
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a release can find the lock lost meanwhile (Release::Lost): the work since was not protected"]
pub enum Release {
    /// The holder held the lock and now does not.
    Released,
    /// The holder held nothing and was not believed to: never acquired, or already released.
    NotHeld,
    /// The holder believed it held the lock, but the store had nothing of it: the lock expired,
    /// was deleted, taken over or its file replaced. Work done since it was lost was not
    /// protected.
    Lost,
    /// Left held: a [`LockGuard`](crate::LockGuard) nested in a holder that already held the
    /// lock when the guard was made lets the outer one release it.
    Kept,
}

impl Release {
    /// Whether the holder held the lock until this release (or still holds it, for
    /// [`Kept`](Release::Kept)).
    pub fn was_held(self) -> bool {
        matches!(self, Release::Released | Release::Kept)
    }
}

/// "A lock": what [`Lock`](crate::Lock) and [`NoLock`] do, so code can take either, as
/// `&dyn Lockable` or generically. Bring it into scope to call a lock's methods
/// (`use xtr_lock::Lockable as _;`).
///
/// Sealed: users hold locks, they do not implement them, so only this crate's two locks
/// implement it (and methods can be added to it without breaking anyone).
///
/// # Waiting
///
/// Blocking acquires use the store's native wait when it has one. Otherwise they retry after
/// each refusal, woken by the store's change notification when it has one (a release by anyone
/// the store can observe), at the moment the current holders' lifetimes end when the store tells
/// it, and otherwise by polling every 90–110 ms (random, on the lock's clock). They never give up
/// by themselves: use [`Wait::AtMost`] or drop the future.
///
/// # Cancellation
///
/// Dropping an acquire future (for example through [`tokio::time::timeout`]) leaves nothing
/// held: if the holder did not hold the lock when the attempt in flight began, a delete of what
/// the store may already have stored is scheduled on the runtime and runs to completion, before
/// any later store operation of the same holder. If the holder held it (re-acquire, promotion,
/// demotion, or a sibling task of the same holder that got it first), nothing is deleted.
///
/// # Dropping a held lock
///
/// No lock releases when dropped (there is no async drop, and a key may live on in another
/// process): where locks are stored data whose keys travel (Redis, the SQL table, Memcached,
/// in-memory) a lock whose holder's handles all went stays held until its ttl; where the lock
/// is held by something of this process (a flock descriptor, a semaphore, a database session,
/// a subscription, an etcd lease) that goes with the holder and lets the lock go. See
/// [`Lock`](crate::Lock#dropping-a-held-lock); a [`LockGuard`](crate::LockGuard) or a scope
/// releases on every path, on every store.
///
/// # Lifetimes
///
/// On expiring stores the lock's ttl goes into the save itself; the key's deadline is measured
/// from just before the successful attempt, so a wait of any length ends with a full lease. A
/// lock whose lifetime ran out before the store confirmed is taken back and reported as
/// [`ErrorKind::Expired`](crate::ErrorKind::Expired), never as held.
#[async_trait]
pub trait Lockable: sealed::Sealed + Send + Sync {
    /// The resource.
    fn resource(&self) -> &str;

    /// Where the lock lives, as logs and errors name it (never a credential); `None` for a lock
    /// that lives nowhere ([`NoLock`]).
    fn store_name(&self) -> Option<String> {
        None
    }

    /// Takes the lock in `mode`, waiting as `wait` says: `Ok(false)` when someone else holds it
    /// (logged at info) and the wait ran out. Every other acquire form is this one.
    ///
    /// - Write: a reader that is the sole reader is promoted; a reader that is not keeps its
    ///   read lock and gets `Ok(false)` (or waits).
    /// - Read: shared with other readers; a writer that asks is demoted. On a store without
    ///   shared locks ([`Capabilities::shared`](crate::store::Capabilities::shared) false: the
    ///   SQL table, `GET_LOCK`, Memcached, SysV semaphores) this takes the write lock instead
    ///   (logged at debug): readers then exclude each other.
    /// - Acquiring what the holder already holds succeeds at once.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Expired`](crate::ErrorKind::Expired) if the lifetime ran out before the
    /// store confirmed (taken back); [`ErrorKind::Acquiring`](crate::ErrorKind::Acquiring) with
    /// the store's error as source for any other failure, which also ends a wait, except that
    /// a [`Wait::AtMost`] wait retries a temporary error until its deadline and then returns
    /// the last one (not `Ok(false)`: the lock was never seen held). A ttl or wait longer than
    /// [`MAX_DURATION`](crate::MAX_DURATION) is refused before anything is stored.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held that the holder did not
    /// hold before (see the trait's docs).
    async fn acquire_with(&self, mode: Mode, wait: Wait) -> Result<bool>;

    /// Tries once to take the write lock: `acquire_with(Write, Wait::Never)`.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Lockable::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
    /// use xtr_lock::Lockable as _;
    /// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
    /// let lock = factory.create_lock("nightly-report");
    /// if lock.try_acquire().await? {
    ///     // ... the work only one worker may do ...
    ///     let _ = lock.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    async fn try_acquire(&self) -> Result<bool> {
        self.acquire_with(Mode::Write, Wait::Never).await
    }

    /// Waits until the write lock is taken: `acquire_with(Write, Wait::Forever)`.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Lockable::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
    /// use xtr_lock::Lockable as _;
    /// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
    /// let lock = factory.create_lock("subscription:42");
    /// lock.acquire().await?;
    /// let _ = lock.release().await?;
    /// # Ok(()) }
    /// ```
    async fn acquire(&self) -> Result<()> {
        self.acquire_with(Mode::Write, Wait::Forever)
            .await
            .map(|_| ())
    }

    /// Waits up to `wait` (on the lock's clock) for the write lock; `Ok(false)` if it did not
    /// come in time.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Lockable::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: on timeout or drop it leaves nothing held.
    async fn acquire_timeout(&self, wait: Duration) -> Result<bool> {
        self.acquire_with(Mode::Write, Wait::AtMost(wait)).await
    }

    /// Tries once to take a read lock: `acquire_with(Read, Wait::Never)`. On a store without shared locks this takes the write lock (see
    /// [`acquire_with`](Lockable::acquire_with)).
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Lockable::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    async fn try_acquire_read(&self) -> Result<bool> {
        self.acquire_with(Mode::Read, Wait::Never).await
    }

    /// Waits until a read lock is taken: `acquire_with(Read, Wait::Forever)`. On a store without shared locks this takes the write lock (see
    /// [`acquire_with`](Lockable::acquire_with)).
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Lockable::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    async fn acquire_read(&self) -> Result<()> {
        self.acquire_with(Mode::Read, Wait::Forever)
            .await
            .map(|_| ())
    }

    /// Waits up to `wait` for a read lock; `Ok(false)` if it did not come in time. On a store without shared locks this takes the write lock (see
    /// [`acquire_with`](Lockable::acquire_with)).
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Lockable::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: on timeout or drop it leaves nothing held.
    async fn acquire_read_timeout(&self, wait: Duration) -> Result<bool> {
        self.acquire_with(Mode::Read, Wait::AtMost(wait)).await
    }

    /// Extends the lifetime to `ttl` from now, or to the lock's ttl when `ttl` is `None`. On
    /// stores without expiry it only checks that the holder still holds.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) when there is no
    ///   duration (no argument, no lock ttl), [`ErrorKind::InvalidTtl`](crate::ErrorKind::InvalidTtl)
    ///   for a zero duration; both before any store call;
    /// - [`ErrorKind::Lost`](crate::ErrorKind::Lost) when the holder believed it held and the
    ///   store has nothing of it (expired, deleted, taken over), with the store's reason; the
    ///   loss is recorded, so a later release reports [`Release::Lost`];
    /// - [`ErrorKind::Conflict`](crate::ErrorKind::Conflict) when the holder never held (or had
    ///   released);
    /// - [`ErrorKind::Expired`](crate::ErrorKind::Expired) if the new lifetime ran out before the
    ///   store confirmed;
    /// - [`ErrorKind::Acquiring`](crate::ErrorKind::Acquiring) ("failed to define an
    ///   expiration") for anything else.
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves the lock held, with either its old or its new lifetime.
    async fn refresh(&self, ttl: Option<Duration>) -> Result<()>;

    /// Releases the lock, in either mode, for every task and lock of this holder.
    ///
    /// Succeeds when there is nothing to release; the [`Release`] tells what was found,
    /// including a lock that had been lost while believed held. Never touches another holder's
    /// lock.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Releasing`](crate::ErrorKind::Releasing) with the store's error as source.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped mid-flight, the lock may or may not have been released. Use a
    /// [`LockGuard`](crate::LockGuard), whose drop schedules the release, when the caller may
    /// be cancelled.
    async fn release(&self) -> Result<Release>;

    /// Asks the store whether this holder holds the lock (either mode), and remembers the
    /// answer (its mode, or that a lock believed held was lost). Read-only on the store.
    ///
    /// # Errors
    ///
    /// The store's error, unchanged.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing on the store.
    async fn is_acquired(&self) -> Result<bool>;

    /// The mode this holder believes it holds the lock in (local: updated by every call and by
    /// its monitor).
    fn held_mode(&self) -> Option<Mode>;

    /// Why the lock was lost, when the holder found out (a refresh, a check, its monitor) and has
    /// not released since.
    fn lost_reason(&self) -> Option<LostReason>;

    /// Whether the lifetime has run out (local: read from the key).
    fn is_expired(&self) -> bool;

    /// The lifetime left (local: read from the key); `None` without one. It counts only what
    /// the store confirmed: while a renewal is in flight it is the lease from before it, so a
    /// renewal that never lands never lengthens what the holder believes.
    fn remaining_lifetime(&self) -> Option<Duration>;

    /// The fencing token of the current acquisition, where the store gives one. An exclusive
    /// acquisition's token is greater than every earlier acquisition's of this resource; a
    /// shared one's is at least every earlier exclusive token, and every later exclusive token
    /// exceeds it (readers may share one). Pass it to downstream systems so they can refuse
    /// what carries a token below the newest they have seen: a stale holder's writes.
    fn fencing_token(&self) -> Option<u64>;

    /// Starts keeping the held lock alive and watching for its loss, in the background (see
    /// [`KeepAlive`]). Call it once the lock is held.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) outside a tokio runtime.
    fn keep_alive(&self) -> Result<KeepAlive>;

    /// Schedules a release without waiting for it, ordered before the holder's next store
    /// operation (what a dropped guard or scope does).
    fn release_in_background(&self);
}

/// Keeps [`Lockable`] to this crate's locks.
mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::lock::Lock {}
    impl Sealed for super::NoLock {}
}

/// A lock that always succeeds and locks nothing: for code that takes "a lock" when locking is
/// not wanted.
///
/// Acquires return true, [`is_acquired`](Lockable::is_acquired) is `true`, refresh and release
/// do nothing, it never expires, has no lifetime and is never lost. Contrast a
/// [`Lock`](crate::Lock) on a [`NullStore`](crate::NullStore), which acquires but reports not
/// held.
#[derive(Debug, Clone)]
pub struct NoLock {
    resource: String,
}

impl NoLock {
    /// A no-op lock for `resource`.
    pub fn new(resource: impl Into<String>) -> Self {
        NoLock {
            resource: resource.into(),
        }
    }
}

#[async_trait]
impl Lockable for NoLock {
    fn resource(&self) -> &str {
        &self.resource
    }
    async fn acquire_with(&self, _mode: Mode, _wait: Wait) -> Result<bool> {
        Ok(true)
    }
    async fn refresh(&self, _ttl: Option<Duration>) -> Result<()> {
        Ok(())
    }
    async fn release(&self) -> Result<Release> {
        Ok(Release::Released)
    }
    async fn is_acquired(&self) -> Result<bool> {
        Ok(true)
    }
    fn held_mode(&self) -> Option<Mode> {
        Some(Mode::Write)
    }
    fn lost_reason(&self) -> Option<LostReason> {
        None
    }
    fn is_expired(&self) -> bool {
        false
    }
    fn remaining_lifetime(&self) -> Option<Duration> {
        None
    }
    fn fencing_token(&self) -> Option<u64> {
        None
    }
    fn keep_alive(&self) -> Result<KeepAlive> {
        Ok(KeepAlive::inert())
    }
    fn release_in_background(&self) {}
}
