//! [`Semaphore`]: N holders at once. A permit is a holder: a [`Lock`] whose key carries
//! [`Permits`], so every rule of locks (the holder's executor, ttl, renewal, loss, cancellation,
//! fencing where the store has it) holds per holder, and stores keep the layout.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::Key;
use crate::lock::Lock;
use crate::lock::factory::{LockFactory, RunOptions};
use crate::lock::guard::LockGuard;
use crate::lock::lockable::{Lockable as _, Release, Wait};
use crate::permits::Permits;
use crate::store::Usage;
use crate::store::{HolderInfo, Store};

/// A counting semaphore on one resource: at most [`limit`](Semaphore::limit) permits are held at
/// once, by every holder in every process that uses the same store and name. Each `Semaphore`
/// is one holder taking [`count`](Semaphore::count) permits (one unless
/// [`permits`](Semaphore::permits) says more), all at once and given back together.
///
/// Made by [`LockFactory::create_semaphore`]. Its methods are a lock's: waiting, cancellation,
/// lifetimes and loss work as [`Lockable`](crate::Lockable) describes.
///
/// # Holders
///
/// [`acquire`](Semaphore::acquire), [`try_acquire`](Semaphore::try_acquire),
/// [`refresh`](Semaphore::refresh) and [`release`](Semaphore::release) act for this
/// `Semaphore`'s own holder (clones share it: acquiring what it holds takes nothing more).
/// [`lock`](Semaphore::lock), [`scoped`](Semaphore::scoped) and [`run`](Semaphore::run) take
/// their permits with a **new holder each call**, so tasks that share one `Semaphore` (or
/// clones of it) each take their own permits: at most `limit` of them run at once. (A task
/// that already holds permits and calls `scoped` takes more: with a limit of 1 it waits for
/// itself.)
///
/// The limit is part of the semaphore: stores that keep it refuse a holder that asks for another
/// limit while anybody holds, with an error naming both; once nobody holds, the next holder's
/// limit is the semaphore's.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
/// let (a, b, c) = (
///     factory.create_semaphore("exports", 2)?,
///     factory.create_semaphore("exports", 2)?,
///     factory.create_semaphore("exports", 2)?,
/// );
/// assert!(a.try_acquire().await? && b.try_acquire().await?);
/// assert!(!c.try_acquire().await?, "two permits, both held");
/// assert_eq!(c.remaining().await?, 0);
/// let _ = a.release().await?;
/// let n = c.scoped(async { Ok::<_, xtr_lock::Error>(7) }).await?;
/// assert_eq!(n, 7);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    lock: Lock,
}

impl LockFactory {
    /// A semaphore that lets `limit` permits be held at once on `resource`, with a **new
    /// holder** taking one permit, and the factory's ttl.
    ///
    /// # Errors
    ///
    /// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) unless `1 <= limit <= 1000`.
    /// A store without counting semaphores is refused when the semaphore is first acquired
    /// ([`Unsupported`](crate::ErrorKind::Unsupported), saying why).
    pub fn create_semaphore(&self, resource: impl Into<String>, limit: u32) -> Result<Semaphore> {
        let resource = resource.into();
        let permits = Permits::new(limit, 1).map_err(|e| e.with_resource(resource.clone()))?;
        self.create_semaphore_from_key(Key::for_semaphore_with_clock(
            resource,
            permits,
            self.clock().clone(),
        ))
    }

    /// A semaphore acting as `key`'s holder (a key with [`Permits`], for example one
    /// deserialized from another process), with the factory's ttl.
    ///
    /// # Errors
    ///
    /// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) for a lock's key (one without
    /// permits).
    pub fn create_semaphore_from_key(&self, key: Key) -> Result<Semaphore> {
        if key.permits().is_none() {
            return Err(Error::invalid_argument(
                "a semaphore needs a key with permits (Key::for_semaphore); this is a lock's key",
            )
            .with_resource(key.resource()));
        }
        Ok(Semaphore {
            lock: self.create_lock_from_key(key),
        })
    }
}

impl Semaphore {
    /// This semaphore with a **new holder** that takes `count` permits at once (Symfony
    /// Semaphore's weight), with the same store, limit and ttl.
    ///
    /// # Errors
    ///
    /// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) unless `1 <= count <= limit`,
    /// or while this holder holds permits (they would be out of reach: release them first).
    pub fn permits(self, count: u32) -> Result<Semaphore> {
        if self.lock.held_mode().is_some() {
            return Err(Error::invalid_argument(
                "this holder holds permits: release them before asking for another count",
            )
            .with_resource(self.resource()));
        }
        let permits =
            Permits::new(self.limit(), count).map_err(|e| e.with_resource(self.resource()))?;
        Ok(self.with_permits(permits))
    }

    /// A new holder of `permits` with this one's store, clock, ttl and renewal.
    fn with_permits(&self, permits: Permits) -> Semaphore {
        let key = Key::for_semaphore_with_clock(
            self.resource().to_owned(),
            permits,
            self.key().clock().clone(),
        );
        let lock = Lock::new(key, self.lock.store().clone(), self.lock.ttl())
            .with_keep_alive(self.lock.renews());
        Semaphore { lock }
    }

    /// A new holder of the same permits (what `lock`, `scoped` and `run` take them with).
    fn fresh(&self) -> Semaphore {
        self.with_permits(self.permits_of())
    }

    /// The same holder with another ttl, as [`Lock::with_ttl`].
    #[must_use]
    pub fn with_ttl(self, ttl: impl Into<Option<Duration>>) -> Self {
        Semaphore {
            lock: self.lock.with_ttl(ttl),
        }
    }

    /// Whether guards and scopes renew the permits, as [`Lock::with_keep_alive`].
    #[must_use]
    pub fn with_keep_alive(self, renew: bool) -> Self {
        Semaphore {
            lock: self.lock.with_keep_alive(renew),
        }
    }

    fn permits_of(&self) -> Permits {
        // The constructors refuse a key without permits.
        self.key()
            .permits()
            .unwrap_or_else(|| Permits::new(1, 1).expect("1 of 1 is valid"))
    }

    /// How many permits may be held at once.
    pub fn limit(&self) -> u32 {
        self.permits_of().limit()
    }

    /// How many permits this holder takes.
    pub fn count(&self) -> u32 {
        self.permits_of().count()
    }

    /// The semaphore's name.
    pub fn resource(&self) -> &str {
        self.lock.resource()
    }

    /// The holder.
    pub fn key(&self) -> &Key {
        self.lock.key()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        self.lock.store()
    }

    /// The ttl of the permits.
    pub fn ttl(&self) -> Option<Duration> {
        self.lock.ttl()
    }

    /// The holder as a [`Lock`], for code written for locks (`&dyn Lockable`, the CLI): its
    /// write methods take and give back the permits; its read methods are refused.
    pub fn as_lock(&self) -> &Lock {
        &self.lock
    }

    /// Takes the permits, waiting as `wait` says; `Ok(false)` when they did not come in time.
    ///
    /// # Errors
    ///
    /// As [`Lockable::acquire_with`](crate::Lockable::acquire_with);
    /// [`Unsupported`](crate::ErrorKind::Unsupported) on a store without counting semaphores;
    /// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) when the semaphore's holders use
    /// another limit.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped, it leaves nothing held.
    pub async fn acquire_with(&self, wait: Wait) -> Result<bool> {
        self.lock.acquire_with(crate::Mode::Write, wait).await
    }

    /// Takes the permits, waiting as long as it takes.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Semaphore::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe.
    pub async fn acquire(&self) -> Result<()> {
        self.lock.acquire().await
    }

    /// Takes the permits if they are free now.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Semaphore::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe.
    pub async fn try_acquire(&self) -> Result<bool> {
        self.lock.try_acquire().await
    }

    /// Takes the permits, waiting at most `wait`.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Semaphore::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<bool> {
        self.lock.acquire_timeout(wait).await
    }

    /// Extends the permits' lifetime, as [`Lockable::refresh`](crate::Lockable::refresh).
    ///
    /// # Errors
    ///
    /// As [`Lockable::refresh`](crate::Lockable::refresh): `Lost` when the permits are gone.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe in the sense of the holder's executor: the refresh runs to its end.
    pub async fn refresh(&self, ttl: Option<Duration>) -> Result<()> {
        self.lock.refresh(ttl).await
    }

    /// Gives the permits back: [`Release::Released`], [`Release::NotHeld`], or
    /// [`Release::Lost`] when they were gone (expired, removed).
    ///
    /// # Errors
    ///
    /// A storage error.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the release runs to its end.
    pub async fn release(&self) -> Result<Release> {
        self.lock.release().await
    }

    /// Whether the store says this holder holds its permits.
    ///
    /// # Errors
    ///
    /// A storage error.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe.
    pub async fn is_acquired(&self) -> Result<bool> {
        self.lock.is_acquired().await
    }

    /// The fencing token of this holder's acquisition, where the store gives one.
    pub fn fencing_token(&self) -> Option<u64> {
        self.lock.fencing_token()
    }

    /// The lifetime left, on expiring stores.
    pub fn remaining_lifetime(&self) -> Option<Duration> {
        self.lock.remaining_lifetime()
    }

    /// Whether the permits' lifetime ran out (on this holder's clock, which is never later
    /// than the store's).
    pub fn is_expired(&self) -> bool {
        self.lock.is_expired()
    }

    /// Why the holder lost its permits, when it believed it held them and they went.
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        self.lock.lost_reason()
    }

    /// How many permits are held, the limit the holders use, and by whom.
    ///
    /// # Errors
    ///
    /// [`Unsupported`](crate::ErrorKind::Unsupported) on a store without counting semaphores;
    /// a storage error.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe (it reads).
    pub async fn usage(&self) -> Result<Usage> {
        self.counting()?;
        self.store().usage(self.key()).await
    }

    /// Permits free now (for this holder's limit, or the one the holders use).
    ///
    /// # Errors
    ///
    /// As [`usage`](Semaphore::usage).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe.
    pub async fn remaining(&self) -> Result<u32> {
        Ok(self.usage().await?.free(self.limit()))
    }

    /// Who holds permits, with how many each.
    ///
    /// # Errors
    ///
    /// As [`usage`](Semaphore::usage).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe.
    pub async fn holders(&self) -> Result<Vec<HolderInfo>> {
        Ok(self.usage().await?.holders)
    }

    /// Waits for the permits with a **new holder** and returns a guard that renews them,
    /// reports their loss ([`LockGuard::lost`]) and gives them back, as [`Lock::lock`]
    /// ([`LockGuard::lock`] is that holder).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Semaphore::acquire) and [`Lock::lock`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    pub async fn lock(&self) -> Result<LockGuard> {
        self.fresh().lock.lock().await
    }

    /// Waits for the permits with a **new holder**, runs `body` while renewing them, and gives
    /// them back, as [`Lock::scoped`]: a body whose permits are lost is stopped and the call
    /// returns `Lost`.
    ///
    /// # Errors
    ///
    /// As [`Lock::scoped`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe.
    pub async fn scoped<T, E, F>(&self, body: F) -> std::result::Result<T, E>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.fresh().lock.scoped(body).await
    }

    /// Takes the permits with a **new holder** as `options` say (ttl, wait, renewal; `shared`
    /// is refused), runs `body` while renewing them, and gives them back, as
    /// [`LockFactory::run`].
    ///
    /// # Errors
    ///
    /// A [`Conflict`](crate::ErrorKind::Conflict) when the permits did not come in time, and as
    /// [`LockFactory::run`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe.
    pub async fn run<T, E, F, Fut>(&self, options: RunOptions, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let guard = self.guard_for_run(options).await?;
        guard.run(body()).await
    }

    /// The first half of [`run`](Semaphore::run), shared with the blocking API.
    pub(crate) async fn guard_for_run(&self, options: RunOptions) -> Result<LockGuard> {
        let mut lock = self.fresh().lock;
        if let Some(ttl) = options.ttl {
            lock = lock.with_ttl(ttl);
        }
        let lock = lock.with_keep_alive(options.keep_alive);
        if lock
            .acquire_with(options.mode, options.wait.unwrap_or_default())
            .await?
        {
            let monitor = crate::lock::scope::start_monitor(&lock, true).await?;
            Ok(LockGuard::new(lock, true, monitor))
        } else {
            Err(Error::conflict(lock.resource()).with_store(lock.store()))
        }
    }

    fn counting(&self) -> Result<()> {
        crate::lock::counting(self.store().as_ref(), self.key())
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("resource", &self.resource())
            .field("limit", &self.limit())
            .field("count", &self.count())
            .field("store", &format_args!("{}", self.store()))
            .finish_non_exhaustive()
    }
}
