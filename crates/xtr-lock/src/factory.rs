//! [`LockFactory`]: hands out locks on one store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, MonotonicClock};
use crate::error::Error;
use crate::guard::LockGuard;
use crate::key::Key;
use crate::lock::Lock;
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
/// use xtr_lock::{InMemoryStore, LockFactory};
///
/// let factory = LockFactory::new(InMemoryStore::new());
/// let lock = factory.create_lock("invoices").with_ttl(Some(Duration::from_secs(30)));
/// lock.acquire().await?;
/// lock.release().await?;
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

    /// Sets the ttl locks get by default; `None` (or zero) for none.
    pub fn with_default_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl.filter(|t| !t.is_zero());
        self
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

    /// A lock for `resource` with a **new holder**, and the default ttl. Use
    /// [`Lock::with_ttl`] for another lifetime or none.
    pub fn create_lock(&self, resource: impl Into<String>) -> Lock {
        self.create_lock_from_key(self.new_key(resource))
    }

    /// A lock acting as `key`'s holder (for example a key deserialized from another process),
    /// with the default ttl.
    pub fn create_lock_from_key(&self, key: Key) -> Lock {
        Lock::new(key, self.store.clone(), self.ttl)
    }

    /// Runs `body` under the write lock on `resource`, like xtr-lock's `run()`: waits up to
    /// `wait` for the lock (`None`: tries once), gives it `ttl`, releases it on the way out
    /// (also on error, panic or cancellation).
    ///
    /// # Errors
    ///
    /// A [`Conflict`](crate::ErrorKind::Conflict) naming the resource when the lock did not
    /// come in time; other acquire and release errors; the body's error. All converted into `E`
    /// (which can simply be [`Error`]).
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
    /// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
    /// let sent = factory
    ///     .run("renew:sub-42", Some(Duration::from_secs(60)), Some(Duration::from_secs(5)), || async {
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
        ttl: Option<Duration>,
        wait: Option<Duration>,
        body: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let lock = self.create_lock(resource).with_ttl(ttl);
        let got = match wait {
            None => lock.try_acquire().await?,
            Some(wait) => lock.acquire_timeout(wait).await?,
        };
        if !got {
            return Err(E::from(
                Error::conflict(lock.resource()).with_store(lock.store()),
            ));
        }
        LockGuard::new(lock, true).run(body()).await
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
