//! The blocking [`Semaphore`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::lock::LockGuard;
use super::rt::Rt;
use crate::error::{Error, Result};
use crate::lock::lockable::{Release, Wait};
use crate::store::HolderInfo;
use crate::store::Usage;

/// A counting semaphore for code without an async runtime: the operations of
/// [`crate::Semaphore`], blocking the calling thread. Clones are the same holder.
///
/// Made by [`LockFactory::create_semaphore`](super::LockFactory::create_semaphore). Every
/// method refuses with [`Unsupported`](crate::ErrorKind::Unsupported) inside a tokio runtime.
///
/// ```
/// # fn main() -> xtr_lock::Result<()> {
/// let factory = xtr_lock::blocking::LockFactory::from_dsn("in-memory")?;
/// let a = factory.create_semaphore("reindex", 3)?.permits(2)?;
/// let b = factory.create_semaphore("reindex", 3)?.permits(2)?;
/// assert!(a.try_acquire()?);
/// assert!(!b.try_acquire()?, "2 + 2 > 3");
/// assert_eq!(a.remaining()?, 1);
/// let _ = a.release()?;
/// b.scoped(|| Ok::<_, xtr_lock::Error>(()))?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    pub(super) inner: crate::Semaphore,
    pub(super) rt: Arc<Rt>,
}

impl Semaphore {
    /// A new holder taking `count` permits, as [`crate::Semaphore::permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::permits`].
    pub fn permits(self, count: u32) -> Result<Semaphore> {
        Ok(Semaphore {
            inner: self.inner.permits(count)?,
            rt: self.rt,
        })
    }

    /// The same holder with another ttl, as [`crate::Lock::with_ttl`].
    #[must_use]
    pub fn with_ttl(mut self, ttl: impl Into<Option<Duration>>) -> Self {
        self.inner = self.inner.with_ttl(ttl);
        self
    }

    /// Whether guards and scopes renew the permits, as [`crate::Lock::with_keep_alive`].
    #[must_use]
    pub fn with_keep_alive(mut self, renew: bool) -> Self {
        self.inner = self.inner.with_keep_alive(renew);
        self
    }

    /// The holder (its key travels with its permits).
    pub fn key(&self) -> &crate::Key {
        self.inner.key()
    }

    /// Why the holder lost its permits, when it believed it held them and they went.
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        self.inner.lost_reason()
    }

    /// The semaphore's name.
    pub fn resource(&self) -> &str {
        self.inner.resource()
    }

    /// How many permits may be held at once.
    pub fn limit(&self) -> u32 {
        self.inner.limit()
    }

    /// How many permits this holder takes.
    pub fn count(&self) -> u32 {
        self.inner.count()
    }

    /// The async semaphore behind it.
    pub fn as_async(&self) -> &crate::Semaphore {
        &self.inner
    }

    /// Takes the permits, waiting as `wait` says, as [`crate::Semaphore::acquire_with`].
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::acquire_with`]; `Unsupported` inside a tokio runtime.
    pub fn acquire_with(&self, wait: Wait) -> Result<bool> {
        self.rt.run(self.inner.acquire_with(wait))?
    }

    /// Takes the permits if they are free now.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    pub fn try_acquire(&self) -> Result<bool> {
        self.acquire_with(Wait::Never)
    }

    /// Waits until the permits are taken.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    pub fn acquire(&self) -> Result<()> {
        self.acquire_with(Wait::Forever).map(|_| ())
    }

    /// Takes the permits, waiting at most `wait`.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    pub fn acquire_timeout(&self, wait: Duration) -> Result<bool> {
        self.acquire_with(Wait::AtMost(wait))
    }

    /// Extends the permits' lifetime.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::refresh`].
    pub fn refresh(&self, ttl: Option<Duration>) -> Result<()> {
        self.rt.run(self.inner.refresh(ttl))?
    }

    /// Gives the permits back.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::release`].
    pub fn release(&self) -> Result<Release> {
        self.rt.run(self.inner.release())?
    }

    /// Whether the store says this holder holds its permits.
    ///
    /// # Errors
    ///
    /// A storage error.
    pub fn is_acquired(&self) -> Result<bool> {
        self.rt.run(self.inner.is_acquired())?
    }

    /// How many permits are held, the limit, and by whom.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::usage`].
    pub fn usage(&self) -> Result<Usage> {
        self.rt.run(self.inner.usage())?
    }

    /// Permits free now.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::usage`].
    pub fn remaining(&self) -> Result<u32> {
        self.rt.run(self.inner.remaining())?
    }

    /// Who holds permits.
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::usage`].
    pub fn holders(&self) -> Result<Vec<HolderInfo>> {
        self.rt.run(self.inner.holders())?
    }

    /// The fencing token of this holder's acquisition, where the store gives one.
    pub fn fencing_token(&self) -> Option<u64> {
        self.inner.fencing_token()
    }

    /// Waits for the permits with a new holder and returns a guard that renews them, reports
    /// their loss and gives them back when dropped, as [`crate::Semaphore::lock`].
    ///
    /// # Errors
    ///
    /// As [`crate::Semaphore::lock`]; `Unsupported` inside a runtime.
    pub fn lock(&self) -> Result<LockGuard> {
        let inner = self.rt.run(self.inner.lock())??;
        Ok(LockGuard {
            inner: Some(inner),
            rt: self.rt.clone(),
        })
    }

    /// Takes the permits with a new holder as `options` say, runs `body` on this thread while
    /// they are renewed, and gives them back, as [`crate::Semaphore::run`].
    ///
    /// # Errors
    ///
    /// A [`Conflict`](crate::ErrorKind::Conflict) when the permits did not come in time; as
    /// [`scoped`](Self::scoped).
    pub fn run<T, E, F>(&self, options: crate::RunOptions, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce() -> std::result::Result<T, E>,
        E: From<Error>,
    {
        let inner = self
            .rt
            .run(self.inner.guard_for_run(options))
            .map_err(E::from)?
            .map_err(E::from)?;
        LockGuard {
            inner: Some(inner),
            rt: self.rt.clone(),
        }
        .run(body)
    }

    /// Waits for the permits with a new holder, runs `body` on this thread while they are
    /// renewed, and gives them back on the way out, as [`crate::blocking::Lock::scoped`].
    ///
    /// # Errors
    ///
    /// The acquire's or the release's error converted into `E`, `Lost`, or the body's error.
    pub fn scoped<T, E, F>(&self, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce() -> std::result::Result<T, E>,
        E: From<Error>,
    {
        self.lock()?.run(body)
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}
