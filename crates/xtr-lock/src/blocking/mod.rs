//! The lock API for code without an async runtime (as `reqwest::blocking` is for HTTP): the
//! same locks, guards, renewal and loss signal, each call blocking the calling thread.
//!
//! A [`LockFactory`] (or [`Locks`]) owns a private tokio runtime on one background thread, where
//! the store's connections, the renewals and the background releases live; its clones, locks
//! and guards share it, and it stops when the last of them goes (after background releases
//! still running have finished, 5 s at most).
//!
//! - **Inside a tokio runtime every call refuses** with
//!   [`Unsupported`](crate::ErrorKind::Unsupported) saying so: blocking there would stall the
//!   runtime's thread, and could deadlock it. Use the async API there.
//! - **Timeouts are the cancellation**: [`Lock::acquire_timeout`] gives up at the deadline and
//!   leaves nothing held, as a dropped async acquire does.
//! - A [`LockGuard`] releases when dropped, **before `drop` returns**; a lost lock shows in
//!   [`LockGuard::is_lost`] and [`LockGuard::wait_lost`].
//!
//! ```
//! use std::time::Duration;
//! use xtr_lock::blocking::LockFactory;
//!
//! # fn main() -> xtr_lock::Result<()> {
//! let factory = LockFactory::from_dsn("in-memory")?;
//! let lock = factory.create_lock("nightly-report");
//! let mut guard = lock.lock()?;
//! // ... the work, checking between steps:
//! assert!(guard.wait_lost(Duration::from_millis(1))?.is_none());
//! drop(guard); // released here
//!
//! let other = factory.create_lock("nightly-report");
//! let n = other.scoped(|| Ok::<_, xtr_lock::Error>(42))?;
//! assert_eq!(n, 42);
//! # Ok(()) }
//! ```

mod election;
mod jobs;
mod lock;
mod rt;
mod semaphore;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use election::Election;
pub use lock::{KeepAlive, Lock, LockGuard};
use rt::Rt;
pub use semaphore::Semaphore;

use crate::error::{Error, Result};
use crate::lock::factory::RunOptions;
use crate::store::Store;

/// Makes [`Lock`]s on one store, blocking; see the [module](self).
#[derive(Clone)]
pub struct LockFactory {
    inner: crate::LockFactory,
    rt: Arc<Rt>,
}

impl LockFactory {
    /// A factory on the store a DSN names (the DSNs of [`StoreFactory`](crate::StoreFactory)).
    ///
    /// # Errors
    ///
    /// A DSN no store accepts; `Unsupported` inside a tokio runtime; a runtime that cannot start.
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        let rt = Rt::start()?;
        let store = rt.enter(|| crate::StoreFactory::create_store(dsn))?;
        Ok(LockFactory {
            inner: crate::LockFactory::from_arc(store),
            rt: Arc::new(rt),
        })
    }

    /// A factory on `store`, built by `make` on the factory's runtime (stores that connect or
    /// spawn must be made there).
    ///
    /// # Errors
    ///
    /// `make`'s error; `Unsupported` inside a tokio runtime.
    pub fn with_store<S: Store>(make: impl FnOnce() -> Result<S>) -> Result<Self> {
        let rt = Rt::start()?;
        let store = rt.enter(make)?;
        Ok(LockFactory {
            inner: crate::LockFactory::new(store),
            rt: Arc::new(rt),
        })
    }

    /// The ttl the locks it makes get: a `Duration`, or `None` (or zero) for none; as
    /// [`crate::LockFactory::with_ttl`]. Where a ttl is used: see
    /// [`Lock::with_ttl`](crate::Lock::with_ttl).
    #[must_use]
    pub fn with_ttl(mut self, ttl: impl Into<Option<Duration>>) -> Self {
        self.inner = self.inner.with_ttl(ttl);
        self
    }

    /// The old name of [`with_ttl`](Self::with_ttl).
    #[deprecated(note = "use `with_ttl`, which also takes a plain `Duration`")]
    #[must_use]
    pub fn with_default_ttl(self, ttl: Option<Duration>) -> Self {
        self.with_ttl(ttl)
    }

    /// A lock (a new holder) for `resource`.
    pub fn create_lock(&self, resource: impl Into<String>) -> Lock {
        Lock {
            inner: self.inner.create_lock(resource),
            rt: self.rt.clone(),
        }
    }

    /// A candidate in the election `name`, as [`crate::LockFactory::create_election`].
    pub fn create_election(&self, name: impl Into<String>) -> Election {
        Election {
            inner: Some(self.inner.create_election(name)),
            rt: self.rt.clone(),
        }
    }

    /// A semaphore of `limit` permits on `resource` with a new holder taking one, as
    /// [`crate::LockFactory::create_semaphore`].
    ///
    /// # Errors
    ///
    /// As [`crate::LockFactory::create_semaphore`].
    pub fn create_semaphore(&self, resource: impl Into<String>, limit: u32) -> Result<Semaphore> {
        Ok(Semaphore {
            inner: self.inner.create_semaphore(resource, limit)?,
            rt: self.rt.clone(),
        })
    }

    /// A semaphore acting as `key`'s holder (a key with permits, from another process), as
    /// [`crate::LockFactory::create_semaphore_from_key`].
    ///
    /// # Errors
    ///
    /// As [`crate::LockFactory::create_semaphore_from_key`].
    pub fn create_semaphore_from_key(&self, key: crate::Key) -> Result<Semaphore> {
        Ok(Semaphore {
            inner: self.inner.create_semaphore_from_key(key)?,
            rt: self.rt.clone(),
        })
    }

    /// Runs `body` on this thread under the lock on `resource`, taken as `options` say,
    /// kept alive meanwhile and released on the way out, as [`Lock::scoped`] does.
    ///
    /// # Errors
    ///
    /// A [`Conflict`](crate::ErrorKind::Conflict) when the lock did not come in time, `Lost`,
    /// other acquire and release errors, the body's error; all converted into `E`.
    pub fn run<T, E, F>(
        &self,
        resource: impl Into<String>,
        options: RunOptions,
        body: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce() -> std::result::Result<T, E>,
        E: From<Error>,
    {
        run_with(&self.inner, &self.rt, resource.into(), options, body)
    }

    /// Closes the store (see [`Store::close`]).
    ///
    /// # Errors
    ///
    /// The store's; `Unsupported` inside a tokio runtime.
    pub fn close(&self) -> Result<()> {
        self.rt.run(self.inner.store().close())?
    }
}

fn run_with<T, E, F>(
    factory: &crate::LockFactory,
    rt: &Arc<Rt>,
    resource: String,
    options: RunOptions,
    body: F,
) -> std::result::Result<T, E>
where
    F: FnOnce() -> std::result::Result<T, E>,
    E: From<Error>,
{
    let lock = Lock {
        inner: rt
            .run(factory.take_for_run(resource, options))
            .map_err(E::from)?
            .map_err(E::from)?,
        rt: rt.clone(),
    };
    let monitor = rt
        .run(crate::lock::scope::start_monitor(&lock.inner, true))
        .map_err(E::from)?
        .map_err(E::from)?;
    let guard = LockGuard::from_parts(&lock, monitor);
    guard.run(body)
}

impl fmt::Debug for LockFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LockFactory")
            .field(&self.inner)
            .finish()
    }
}

/// The registry of a configuration's entries ([`crate::config::Locks`]), blocking.
#[derive(Clone)]
pub struct Locks {
    inner: crate::config::Locks,
    rt: Arc<Rt>,
}

impl Locks {
    /// Checks `config` and builds the registry (nothing connects before first use).
    ///
    /// # Errors
    ///
    /// Every problem of the configuration (see [`crate::config::LocksConfig::check`]);
    /// `Unsupported` inside a tokio runtime.
    pub fn new(config: &crate::config::LocksConfig) -> Result<Self> {
        let inner = crate::config::Locks::new(config)?;
        Ok(Locks {
            inner,
            rt: Arc::new(Rt::start()?),
        })
    }

    /// A lock (a new holder) on the default entry for `resource`, with the entry's prefix and
    /// ttl.
    ///
    /// # Errors
    ///
    /// As [`crate::config::Locks::lock`].
    pub fn lock(&self, resource: &str) -> Result<Lock> {
        self.lock_on(self.inner.default_entry(), resource)
    }

    /// A lock on `entry` for `resource`.
    ///
    /// # Errors
    ///
    /// As [`crate::config::Locks::lock_on`].
    pub fn lock_on(&self, entry: &str, resource: &str) -> Result<Lock> {
        let inner = self.rt.enter(|| self.inner.lock_on(entry, resource))?;
        Ok(Lock {
            inner,
            rt: self.rt.clone(),
        })
    }

    /// Runs `body` under the write lock on `resource` on the default entry, with the entry's
    /// prefix, ttl and wait.
    ///
    /// # Errors
    ///
    /// As [`LockFactory::run`].
    pub fn run<T, E, F>(&self, resource: &str, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce() -> std::result::Result<T, E>,
        E: From<Error>,
    {
        self.run_on(
            self.inner.default_entry(),
            resource,
            RunOptions::new(),
            body,
        )
    }

    /// As [`run`](Self::run) under the read lock.
    ///
    /// # Errors
    ///
    /// As [`LockFactory::run`].
    pub fn run_read<T, E, F>(&self, resource: &str, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce() -> std::result::Result<T, E>,
        E: From<Error>,
    {
        self.run_on(
            self.inner.default_entry(),
            resource,
            RunOptions::new().shared(),
            body,
        )
    }

    /// As [`run`](Self::run), on `entry`, with `options` (its wait replaced by the entry's
    /// unless it sets one).
    ///
    /// # Errors
    ///
    /// As [`LockFactory::run`].
    pub fn run_on<T, E, F>(
        &self,
        entry: &str,
        resource: &str,
        options: RunOptions,
        body: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce() -> std::result::Result<T, E>,
        E: From<Error>,
    {
        let (factory, resource, options) = self
            .rt
            .enter(|| self.inner.for_run(entry, resource, options))
            .map_err(E::from)?;
        run_with(&factory, &self.rt, resource, options, body)
    }

    /// Reaches every entry's store, as [`crate::config::Locks::ping`].
    ///
    /// # Errors
    ///
    /// `Unsupported` inside a tokio runtime.
    pub fn ping(&self, deadline: Duration) -> Result<Vec<(String, Result<()>)>> {
        self.rt.run(self.inner.ping(deadline))
    }

    /// Closes every store built so far.
    ///
    /// # Errors
    ///
    /// As [`crate::config::Locks::close`]; `Unsupported` inside a tokio runtime.
    pub fn close(&self) -> Result<()> {
        self.rt.run(self.inner.close())?
    }
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::Locks").field(&self.inner).finish()
    }
}
