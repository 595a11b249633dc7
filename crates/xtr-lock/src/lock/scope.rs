//! Read-side scopes ([`Lock::lock_read`], [`Lock::scoped_read`]) and scopes on any lock type
//! ([`LockableExt`]), beside the write forms of `guard.rs`.

use std::future::Future;

use super::Lock;
use super::guard::{LockGuard, run_scope, start_monitor};
use super::lockable::Lockable;
use crate::error::{Error, Result};
use crate::key::Mode;

/// Takes the read lock for a scope: `Ok(true)` when this scope took it (and must let it go).
///
/// A holder that already holds the write lock keeps it (it covers reading: taking the read lock
/// would demote it under its outer scope); one that holds the read lock re-asserts it.
async fn enter_read<L: Lockable + ?Sized>(lock: &L) -> Result<bool> {
    match lock.held_mode() {
        Some(Mode::Write) => Ok(false),
        Some(Mode::Read) => lock.acquire_read().await.map(|()| false),
        None => lock.acquire_read().await.map(|()| true),
    }
}

impl Lock {
    /// Waits for the read lock and returns a guard that keeps it alive, reports its loss and
    /// releases it: readers hold it together, a writer waits for them.
    ///
    /// A holder that already holds the lock keeps it as it is when the guard goes (nesting);
    /// one holding the write lock is not demoted.
    ///
    /// # Errors
    ///
    /// As [`acquire_read`](Lockable::acquire_read);
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) outside a tokio runtime (the
    /// lock is then released again).
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
    /// let (a, b) = (factory.create_lock("catalog"), factory.create_lock("catalog"));
    /// let reading = a.lock_read().await?;
    /// assert!(b.try_acquire_read().await?, "readers share it");
    /// assert!(!factory.create_lock("catalog").try_acquire().await?, "a writer waits");
    /// reading.unlock().await?;
    /// b.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_read(&self) -> Result<LockGuard> {
        let took = enter_read(self).await?;
        let monitor = start_monitor(self, took).await?;
        Ok(LockGuard::new(self.clone(), took, monitor))
    }

    /// Waits for the read lock, runs `body` while keeping the lock alive, and releases it on the
    /// way out, as [`Lock::scoped`] does for the write lock (a body whose lock is lost is
    /// stopped and the call returns [`ErrorKind::Lost`](crate::ErrorKind::Lost)).
    ///
    /// # Errors
    ///
    /// As [`Lock::scoped`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it leaves nothing held; dropped while the body runs, a
    /// release is scheduled on the runtime.
    pub async fn scoped_read<T, E, F>(&self, body: F) -> std::result::Result<T, E>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let guard = self.lock_read().await?;
        guard.run(body).await
    }
}

impl dyn Lockable + '_ {
    /// Waits for the write lock, runs `body`, and releases on the way out, as
    /// [`Lock::scoped`] does.
    ///
    /// # Errors
    ///
    /// As [`Lock::scoped`].
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
        LockableExt::scoped(self, body).await
    }

    /// Waits for the read lock, runs `body`, and releases on the way out, as
    /// [`Lock::scoped_read`] does.
    ///
    /// # Errors
    ///
    /// As [`Lock::scoped`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it leaves nothing held; dropped while the body runs, a
    /// release is scheduled.
    pub async fn scoped_read<T, E, F>(&self, body: F) -> std::result::Result<T, E>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        LockableExt::scoped_read(self, body).await
    }
}

/// Scopes on any lock type: `scoped` and `scoped_read` for every [`Lockable`] (a [`Lock`], a
/// `dyn Lockable`, [`NoLock`](crate::NoLock), a type of your own), so generic code can use them.
///
/// `Lock` and `dyn Lockable` also have them as inherent methods (no import needed); this trait
/// is what a function generic over `L: Lockable` calls. The returned futures are `Send` when
/// the body and its output are.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::{Lockable, LockableExt as _};
///
/// async fn reindex<L: Lockable>(lock: &L) -> xtr_lock::Result<u32> {
///     lock.scoped(async { Ok(3) }).await
/// }
///
/// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
/// assert_eq!(reindex(&factory.create_lock("index")).await?, 3);
/// # Ok(()) }
/// ```
pub trait LockableExt: Lockable {
    /// Waits for the write lock, runs `body`, and releases on the way out, as [`Lock::scoped`]
    /// does.
    ///
    /// # Errors
    ///
    /// As [`Lock::scoped`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it leaves nothing held; dropped while the body runs, a
    /// release is scheduled.
    fn scoped<T, E, F>(&self, body: F) -> impl Future<Output = std::result::Result<T, E>>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        async move {
            let took = self.held_mode().is_none();
            self.acquire().await?;
            let monitor = start_monitor(self, took).await?;
            run_scope(self, took, monitor, body).await
        }
    }

    /// Waits for the read lock, runs `body`, and releases on the way out, as
    /// [`Lock::scoped_read`] does.
    ///
    /// # Errors
    ///
    /// As [`Lock::scoped`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting it leaves nothing held; dropped while the body runs, a
    /// release is scheduled.
    fn scoped_read<T, E, F>(&self, body: F) -> impl Future<Output = std::result::Result<T, E>>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        async move {
            let took = enter_read(self).await?;
            let monitor = start_monitor(self, took).await?;
            run_scope(self, took, monitor, body).await
        }
    }
}

impl<L: Lockable + ?Sized> LockableExt for L {}
