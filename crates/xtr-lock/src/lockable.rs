//! [`Lockable`]: what [`Lock`](crate::Lock) and [`NoLock`] have in common.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::guard::run_scope;
use crate::lock::Release;

/// "A lock": implemented by [`Lock`](crate::Lock) and [`NoLock`], so code can take either, as
/// `&dyn Lockable` or generically.
///
/// The methods mean what the [`Lock`](crate::Lock) methods of the same name mean, with the
/// same errors and cancel safety.
#[async_trait]
pub trait Lockable: Send + Sync {
    /// The resource.
    fn resource(&self) -> &str;

    /// Tries once to take the write lock; `Ok(false)` when someone else holds it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    async fn try_acquire(&self) -> Result<bool>;

    /// Waits until the write lock is taken.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    async fn acquire(&self) -> Result<()>;

    /// Waits up to `wait` for the write lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: on timeout or drop it leaves nothing held.
    async fn acquire_timeout(&self, wait: Duration) -> Result<bool>;

    /// Tries once to take a read lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    async fn try_acquire_read(&self) -> Result<bool>;

    /// Waits until a read lock is taken.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    async fn acquire_read(&self) -> Result<()>;

    /// Waits up to `wait` for a read lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: on timeout or drop it leaves nothing held.
    async fn acquire_read_timeout(&self, wait: Duration) -> Result<bool>;

    /// Extends the lifetime.
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves the lock held, with either its old or its new lifetime.
    async fn refresh(&self, ttl: Option<Duration>) -> Result<()>;

    /// Releases the lock.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: dropped mid-flight, the lock may or may not have been released.
    async fn release(&self) -> Result<Release>;

    /// Asks whether this holder holds the lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    async fn is_acquired(&self) -> Result<bool>;

    /// Whether the lifetime has run out.
    fn is_expired(&self) -> bool;

    /// The lifetime left.
    fn remaining_lifetime(&self) -> Option<Duration>;

    /// The fencing token of the current exclusive acquisition.
    fn fencing_token(&self) -> Option<u64>;

    /// Whether this holder believes it holds the lock (no store call).
    fn is_believed_held(&self) -> bool;

    /// Schedules a release without waiting for it (used when a scope is dropped).
    fn release_in_background(&self);
}

impl dyn Lockable + '_ {
    /// Waits for the write lock, runs `body`, and releases on the way out, as
    /// [`Lock::scoped`](crate::Lock::scoped) does.
    ///
    /// # Errors
    ///
    /// The acquire's or the release's error converted into `E`, or the body's error.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it leaves nothing held; dropped while the body runs, a
    /// release is scheduled.
    pub async fn scoped<T, E, F>(&self, body: F) -> std::result::Result<T, E>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let took = !self.is_believed_held();
        self.acquire().await?;
        run_scope(self, took, body).await
    }
}

/// A lock that always succeeds and locks nothing: for code that takes "a lock" when locking is
/// not wanted.
///
/// *acquire* and *acquire_read* return true, [`is_acquired`](Lockable::is_acquired) is `true`,
/// refresh and release do nothing, it never expires and has no lifetime. Contrast a
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

    /// Runs `body`; there is nothing to take or release.
    ///
    /// # Errors
    ///
    /// The body's error.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: there is nothing to clean up.
    pub async fn scoped<T, E, F>(&self, body: F) -> std::result::Result<T, E>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        body.await
    }
}

#[async_trait]
impl Lockable for NoLock {
    fn resource(&self) -> &str {
        &self.resource
    }
    async fn try_acquire(&self) -> Result<bool> {
        Ok(true)
    }
    async fn acquire(&self) -> Result<()> {
        Ok(())
    }
    async fn acquire_timeout(&self, _wait: Duration) -> Result<bool> {
        Ok(true)
    }
    async fn try_acquire_read(&self) -> Result<bool> {
        Ok(true)
    }
    async fn acquire_read(&self) -> Result<()> {
        Ok(())
    }
    async fn acquire_read_timeout(&self, _wait: Duration) -> Result<bool> {
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
    fn is_expired(&self) -> bool {
        false
    }
    fn remaining_lifetime(&self) -> Option<Duration> {
        None
    }
    fn fencing_token(&self) -> Option<u64> {
        None
    }
    fn is_believed_held(&self) -> bool {
        true
    }
    fn release_in_background(&self) {}
}
