//! [`LockFactory`]: hands out locks on one store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::Lock;
use super::guard::LockGuard;
use super::lockable::Wait;
use super::policy::OnConflict;
use super::scope::start_monitor;
use crate::clock::{Clock, MonotonicClock};
use crate::error::Error;
use crate::key::{Key, Mode};
use crate::store::Store;

/// The lifetime a lock gets unless told otherwise: 300 s, as in the Python and PHP peers.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// Hands out [`Lock`]s on one store, with one clock.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use std::time::Duration;
/// use xtr_lock::{InMemoryStore, LockFactory, Lockable as _};
///
/// let factory = LockFactory::new(InMemoryStore::new());
/// let lock = factory.create_lock("invoices").with_ttl(Duration::from_secs(30));
/// lock.acquire().await?;
/// let _ = lock.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockFactory {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    ttl: Option<Duration>,
}

impl LockFactory {
    /// A factory for locks in `store`, on the monotonic clock, with a default ttl of 300 s.
    pub fn new(store: impl Store) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// Like [`new`](LockFactory::new), for a store already shared (for example from
    /// [`StoreFactory::create_store`](crate::StoreFactory::create_store)).
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        LockFactory {
            store,
            clock: Arc::new(MonotonicClock),
            ttl: Some(DEFAULT_TTL),
        }
    }

    /// Uses `clock` for the lifetimes of the keys this factory makes and for retry sleeps. A
    /// [`ManualClock`](crate::ManualClock) makes waits instant and expiry deterministic.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// A factory on the store `dsn` names (any DSN of [`StoreFactory`](crate::StoreFactory)),
    /// with a default ttl of 300 s: `LockFactory::from_dsn("redis://cache:6379/0")?`.
    ///
    /// Not `async`, as every `from_dsn` of the crate (the stores' and the blocking
    /// [`LockFactory::from_dsn`](crate::blocking::LockFactory::from_dsn)): building a store
    /// never touches the network, so a server that is down is only seen by the first lock
    /// call. Call it inside the runtime the locks will run on: some stores start tasks there
    /// when they are made.
    ///
    /// # Errors
    ///
    /// As [`StoreFactory::create_store`](crate::StoreFactory::create_store): a DSN that names
    /// no store ([`InvalidArgument`](crate::ErrorKind::InvalidArgument)) or a store this build
    /// lacks ([`Unsupported`](crate::ErrorKind::Unsupported)), the scheme shown, never a
    /// credential.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
    /// use std::time::Duration;
    /// use xtr_lock::{LockFactory, Lockable as _};
    /// let factory = LockFactory::from_dsn("in-memory")?.with_ttl(Duration::from_secs(30));
    /// let lock = factory.create_lock("invoices");
    /// assert!(lock.try_acquire().await?);
    /// assert!(lock.release().await?.was_held());
    /// # Ok(()) }
    /// ```
    pub fn from_dsn(dsn: &str) -> crate::Result<Self> {
        Ok(Self::from_arc(crate::StoreFactory::create_store(dsn)?))
    }

    /// The ttl the locks it makes get: a `Duration`, or `None` (or zero) for none; the same
    /// argument as [`Lock::with_ttl`], which says where a ttl is used.
    #[must_use]
    pub fn with_ttl(mut self, ttl: impl Into<Option<Duration>>) -> Self {
        self.ttl = super::lifetime(ttl);
        self
    }

    /// The old name of [`with_ttl`](Self::with_ttl).
    #[deprecated(note = "use `with_ttl`, which also takes a plain `Duration`")]
    #[must_use]
    pub fn with_default_ttl(self, ttl: Option<Duration>) -> Self {
        self.with_ttl(ttl)
    }

    /// The ttl the locks it makes get (`None`: none).
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A new key (a new holder) for `resource` on this factory's clock.
    pub fn new_key(&self, resource: impl Into<String>) -> Key {
        Key::with_clock(resource, self.clock.clone())
    }

    /// A lock for `resource` with a **new holder**, and the factory's ttl. Use
    /// [`Lock::with_ttl`] for another lifetime or none.
    pub fn create_lock(&self, resource: impl Into<String>) -> Lock {
        self.create_lock_from_key(self.new_key(resource))
    }

    /// Ends the factory's use of its store, for a program about to exit: waits (at most
    /// `within`) for the store calls its locks still run in the background (see
    /// [`settle`](crate::settle): a dropped acquire's clean-up, a dropped guard's release),
    /// then closes the store. `Ok(true)` when nothing was left running.
    ///
    /// # Errors
    ///
    /// What closing the store returned.
    ///
    /// # Cancel safety
    ///
    /// Dropped while it waits, nothing is lost (what it waits for goes on); dropped while it
    /// closes, as [`Store::close`].
    pub async fn shutdown(&self, within: Duration) -> crate::Result<bool> {
        let settled = crate::serial::settle(within).await;
        self.store.close().await?;
        Ok(settled)
    }

    /// A lock acting as `key`'s holder (for example a key deserialized from another process),
    /// with the default ttl.
    pub fn create_lock_from_key(&self, key: Key) -> Lock {
        Lock::new(key, self.store.clone(), self.ttl)
    }

    /// Runs `body` under the lock on `resource`: takes it as `options` say (by default: the
    /// write lock, waiting for it, with the factory's ttl), keeps it alive while the body runs,
    /// and releases it on the way out (also on error, panic or cancellation), as
    /// [`Lock::scoped`] does. **A body whose lock is lost is stopped** and the call returns
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost); see [`Lock::scoped`].
    ///
    /// # Errors
    ///
    /// A [`Conflict`](crate::ErrorKind::Conflict) naming the resource when the lock did not
    /// come in time; `Lost`; other acquire and release errors; the body's error. All converted
    /// into `E` (which can simply be [`Error`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it leaves nothing held; dropped while the body runs,
    /// a release is scheduled.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
    /// use std::time::Duration;
    /// use xtr_lock::{RunOptions, Wait};
    /// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
    /// let options = RunOptions::new()
    ///     .ttl(Duration::from_secs(60))
    ///     .wait(Wait::AtMost(Duration::from_secs(5)));
    /// let sent = factory
    ///     .run("renew:sub-42", options, || async {
    ///         // renew the subscription once
    ///         Ok::<_, xtr_lock::Error>(true)
    ///     })
    ///     .await?;
    /// assert!(sent);
    /// # Ok(()) }
    /// ```
    pub async fn run<T, E, F, Fut>(
        &self,
        resource: impl Into<String>,
        options: RunOptions,
        body: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let lock = self.take_for_run(resource, options).await?;
        let monitor = start_monitor(&lock, true).await?;
        LockGuard::new(lock, true, monitor).run(body()).await
    }

    /// The first half of [`run`](Self::run), shared with the blocking API: a new lock with the
    /// options' ttl and renewal, taken as they say, or a conflict naming the resource.
    pub(crate) async fn take_for_run(
        &self,
        resource: impl Into<String>,
        options: RunOptions,
    ) -> crate::Result<Lock> {
        let mut lock = self.create_lock(resource);
        if let Some(ttl) = options.ttl {
            lock = lock.with_ttl(ttl);
        }
        let lock = lock
            .with_keep_alive(options.keep_alive)
            .with_min_hold(options.min_hold.unwrap_or_default())
            .with_max_hold(options.max_hold.unwrap_or_default());
        let wait = options.wait.unwrap_or_default();
        if lock
            .acquire_with_policy(options.mode, wait, options.on_conflict)
            .await?
        {
            Ok(lock)
        } else {
            Err(Error::conflict(lock.resource()).with_store(lock.store()))
        }
    }

    /// Runs `body` under the read lock on `resource`, waiting for it, with the factory's ttl:
    /// `run(resource, RunOptions::new().shared(), body)`. Readers run together; a writer waits
    /// for them. On a store without shared locks the body runs under the write lock (see
    /// [`Lockable::acquire_with`](crate::Lockable::acquire_with)).
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Self::run).
    pub async fn run_read<T, E, F, Fut>(
        &self,
        resource: impl Into<String>,
        body: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.run(resource, RunOptions::new().shared(), body).await
    }
}

/// How [`LockFactory::run`] takes its lock. Built with named setters, so a ttl and a wait cannot
/// be swapped by accident:
///
/// ```
/// use std::time::Duration;
/// use xtr_lock::{RunOptions, Wait};
/// let options = RunOptions::new().ttl(Duration::from_secs(30)).wait(Wait::Never);
/// # let _ = options;
/// ```
///
/// The default: the write lock, [`Wait::Forever`] (as `xtr-lock run` without `-n` or `-w`),
/// the factory's ttl, renewed while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOptions {
    pub(crate) ttl: Option<Option<Duration>>,
    /// `None`: not set (forever, or a registry entry's wait).
    pub(crate) wait: Option<Wait>,
    pub(crate) mode: Mode,
    pub(crate) keep_alive: bool,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) on_conflict: OnConflict,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            ttl: None,
            wait: None,
            mode: Mode::Write,
            keep_alive: true,
            min_hold: None,
            max_hold: None,
            on_conflict: OnConflict::Wait,
        }
    }
}

impl RunOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lock's lifetime, instead of the factory's: a `Duration`, or `None` (or zero) for
    /// none (stores where locks expire refuse a lock without one); the same argument as
    /// [`Lock::with_ttl`], which says where a ttl is used.
    pub fn ttl(mut self, ttl: impl Into<Option<Duration>>) -> Self {
        self.ttl = Some(super::lifetime(ttl));
        self
    }

    /// No lifetime: the old name of `ttl(None)`.
    #[deprecated(note = "use `ttl(None)`")]
    pub fn no_ttl(self) -> Self {
        self.ttl(None)
    }

    /// How long to wait for a lock held by someone else.
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Whether [`wait`](Self::wait) was called.
    pub(crate) fn wait_is_set(&self) -> bool {
        self.wait.is_some()
    }

    /// Takes a shared (read) lock instead of the write lock; on a store without shared locks,
    /// the write lock (see [`Lockable::acquire_with`](crate::Lockable::acquire_with)).
    pub fn shared(mut self) -> Self {
        self.mode = Mode::Read;
        self
    }

    /// Whether an expiring lock is renewed while the body runs (the default). Without renewal
    /// the body is stopped when the lock's lifetime ends.
    pub fn keep_alive(mut self, renew: bool) -> Self {
        self.keep_alive = renew;
        self
    }

    /// Holds the lock at least `min` from its acquisition, even if the body ends sooner (see
    /// [`Lock::with_min_hold`]): the body's scheduled job does not run again elsewhere within
    /// `min`, whatever the other machines' clocks say.
    pub fn min_hold(mut self, min: Duration) -> Self {
        self.min_hold = Some(min);
        self
    }

    /// Holds the lock at most `max` from its acquisition: the body is stopped then, the lock
    /// released, and the call returns [`Lost`](crate::ErrorKind::Lost) with
    /// [`LostReason::HeldTooLong`](crate::LostReason::HeldTooLong) (see
    /// [`Lock::with_max_hold`]).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = Some(max);
        self
    }

    /// What to do when someone else holds the lock (see [`OnConflict`]); the wait bounds
    /// every policy that waits.
    pub fn on_conflict(mut self, on_conflict: OnConflict) -> Self {
        self.on_conflict = on_conflict;
        self
    }
}

impl fmt::Debug for LockFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockFactory")
            .field("store", &format_args!("{}", self.store))
            .field("clock", &self.clock)
            .field("ttl", &self.ttl)
            .finish()
    }
}
