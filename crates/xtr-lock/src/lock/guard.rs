//! [`LockGuard`], taken by [`Lock::lock`] and [`Lock::lock_read`]: a held lock kept alive,
//! watched, and released when the guard goes. Scopes, which guards enter and leave through, are
//! in `scope.rs`.

use std::fmt;

use super::Lock;
use super::lockable::{Lockable, Release};
use super::lost::{KeepAlive, LockLost};
use super::scope::{enter, run_scope};
use crate::error::{Error, Result};
use crate::key::Mode;

/// Holds a lock taken by [`Lock::lock`] (write) or [`Lock::lock_read`] (read), keeps it alive, tells when it is lost, and
/// releases it when it goes.
///
/// - [`unlock`](LockGuard::unlock) releases now and says what it found (a lock lost meanwhile is
///   [`Release::Lost`]): prefer it.
/// - [`lost`](LockGuard::lost) completes when the lock is lost (expired, deleted, taken over,
///   its file replaced): select on it where the work can stop.
/// - While the guard lives, an expiring lock is renewed at a third of its ttl (unless the lock
///   was made [`with_keep_alive(false)`](Lock::with_keep_alive)).
/// - Dropping the guard cannot wait (there is no async drop), so it **schedules** the release on
///   the current tokio runtime (or, outside any runtime, on a short-lived thread) and returns at
///   once. The release runs before any later store operation of the same holder, but another
///   holder may find the lock still taken for a moment; errors of a scheduled release are logged
///   at warn.
/// - A guard made while its holder already held the lock (nesting) leaves the lock held.
/// - [`keep`](LockGuard::keep) gives up the guard (and its renewal) and leaves the lock held.
#[must_use = "dropping the guard releases the lock (in the background) at once"]
pub struct LockGuard {
    lock: Lock,
    took: bool,
    active: bool,
    monitor: KeepAlive,
}

impl LockGuard {
    pub(crate) fn new(lock: Lock, took: bool, monitor: KeepAlive) -> Self {
        LockGuard {
            lock,
            took,
            active: true,
            monitor,
        }
    }

    /// The lock this guard holds.
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// The fencing token of this acquisition, where the store gives one.
    pub fn fencing_token(&self) -> Option<u64> {
        self.lock.fencing_token()
    }

    /// Whether this guard took the lock (and so releases it), rather than nesting in a holder
    /// that already held it.
    pub fn took(&self) -> bool {
        self.took
    }

    /// Completes when the lock is lost, with why; pending forever while it is held.
    ///
    /// Takes `&self` and borrows nothing: the future can be awaited while the guard is used
    /// otherwise (its token read, `is_lost` asked), moved into a task, or made again at each
    /// step of the work.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping it misses nothing; a later call reports the same loss.
    pub fn lost(&self) -> impl Future<Output = LockLost> + Send + 'static {
        self.monitor.lost()
    }

    /// Whether the lock is known to be lost (no waiting).
    pub fn is_lost(&self) -> bool {
        self.monitor.is_lost() || self.lock.lost_reason().is_some()
    }

    /// Releases the lock now, if this guard took it, and says what it found:
    /// [`Release::Released`], [`Release::Lost`] when the lock had been lost meanwhile (the work
    /// since was not protected), or for a nested guard [`Release::Kept`] (or `Lost`).
    ///
    /// # Errors
    ///
    /// The release's error ([`ErrorKind::Releasing`](crate::ErrorKind::Releasing)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, the release is scheduled as for a dropped guard.
    pub async fn unlock(mut self) -> Result<Release> {
        let result = if self.took {
            self.lock.release().await
        } else if self.lock.lost_reason().is_some() {
            Ok(Release::Lost)
        } else {
            Ok(Release::Kept)
        };
        self.active = false;
        result
    }

    /// Gives up the guard and leaves the lock held; returns the lock. The renewal stops: keep
    /// an expiring lock alive yourself ([`keep_alive`](Lockable::keep_alive)).
    pub fn keep(mut self) -> Lock {
        self.active = false;
        self.lock.clone()
    }

    /// Runs `body` under the guard, then releases as [`Lock::scoped`] does.
    ///
    /// # Errors
    ///
    /// As [`Lock::scoped`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, the release is scheduled as for a dropped guard.
    pub async fn run<T, E, F>(mut self, body: F) -> std::result::Result<T, E>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let monitor = std::mem::replace(&mut self.monitor, KeepAlive::inert());
        // From here the scope releases (also when dropped or when the body panics): the guard
        // must not schedule a second release, which could reach the store after the holder has
        // taken the lock again and take that back.
        self.active = false;
        run_scope(&self.lock, self.took, monitor, body).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.active && self.took {
            self.lock.release_in_background();
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock)
            .field("took", &self.took)
            .field("monitor", &self.monitor)
            .finish()
    }
}

impl Lock {
    /// Waits for the write lock and returns a guard that keeps it alive, reports its loss and
    /// releases it.
    ///
    /// If this holder already held the lock, the guard leaves it held when it goes (nesting).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Lockable::acquire); [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported)
    /// outside a tokio runtime (the lock is then released again).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held.
    ///
    /// # Examples
    ///
    /// Work that can stop between steps, told when the lock goes:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
    /// use xtr_lock::Release;
    /// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
    /// let lock = factory.create_lock("reindex");
    /// let guard = lock.lock().await?;
    /// for step in 0..3 {
    ///     tokio::select! {
    ///         lost = guard.lost() => return Err(lost.into()),
    ///         () = async { /* step `step` of the work */ let _ = step; } => {}
    ///     }
    /// }
    /// assert_eq!(guard.unlock().await?, Release::Released);
    /// # Ok(()) }
    /// ```
    pub async fn lock(&self) -> Result<LockGuard> {
        let (took, monitor) = enter(self, Mode::Write).await?;
        Ok(LockGuard::new(self.clone(), took, monitor))
    }

    /// Waits for the read lock and returns a guard that keeps it alive, reports its loss and
    /// releases it: readers hold it together, a writer waits for them. On a store without
    /// shared locks this takes the write lock (see [`acquire_with`](Lockable::acquire_with)).
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
    /// let _ = reading.unlock().await?;
    /// let _ = b.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock_read(&self) -> Result<LockGuard> {
        let (took, monitor) = enter(self, Mode::Read).await?;
        Ok(LockGuard::new(self.clone(), took, monitor))
    }
}
