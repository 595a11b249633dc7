//! [`LockGuard`] and scoped use: a held lock kept alive, watched, and released on the way out.

use std::fmt;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt as _;

use super::Lock;
use super::lockable::{Lockable, Release};
use super::lost::{KeepAlive, LockLost};
use crate::error::{Error, LostReason, Result};
use crate::logging::TARGET;

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
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping it misses nothing; a later call reports the same loss.
    pub async fn lost(&mut self) -> LockLost {
        self.monitor.lost().await
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
    /// let mut guard = lock.lock().await?;
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
        let took = self.held_mode().is_none();
        self.acquire().await?;
        let monitor = start_monitor(self, took).await?;
        Ok(LockGuard::new(self.clone(), took, monitor))
    }

    /// Waits for the write lock, runs `body` while keeping the lock alive, and releases the lock
    /// on the way out, also when the body fails, panics or is cancelled, unless this holder
    /// already held the lock when the scope began (nesting).
    ///
    /// **A body whose lock is lost is stopped**: it is dropped at its next `.await` and the call
    /// returns [`ErrorKind::Lost`](crate::ErrorKind::Lost) (as a command under `xtr-lock run` is
    /// stopped). A body that completes although its lock was lost meanwhile does not return
    /// `Ok` either: the release finds nothing and the call returns `Lost`. To decide yourself
    /// where work can stop, hold a [`LockGuard`] and select on [`LockGuard::lost`].
    ///
    /// The body's error wins over a release error or a loss, which are then logged at warn.
    ///
    /// # Errors
    ///
    /// The acquire's or the release's error converted into `E`, `Lost`, or the body's error.
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
    /// use xtr_lock::Lockable as _;
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
}

/// Starts the monitor of a lock just acquired; if it cannot start, releases the lock again when
/// this acquisition took it, so that a failure leaves nothing held.
pub(crate) async fn start_monitor<L: Lockable + ?Sized>(lock: &L, took: bool) -> Result<KeepAlive> {
    match lock.keep_alive() {
        Ok(monitor) => Ok(monitor),
        Err(err) => {
            if took {
                let _ = lock.release().await;
            }
            Err(err)
        }
    }
}

/// How a scope's body ended.
enum Ended<T, E> {
    Returned(std::result::Result<T, E>),
    Panicked(Box<dyn std::any::Any + Send>),
    /// Dropped: its lock was lost.
    Stopped(LockLost),
}

/// Runs `body` while `monitor` watches the lock; on the way out (result, error, panic, loss or
/// drop) releases the lock if the scope took it, and reports a loss as an error.
pub(crate) async fn run_scope<L, T, E, F>(
    lock: &L,
    took: bool,
    mut monitor: KeepAlive,
    body: F,
) -> std::result::Result<T, E>
where
    L: Lockable + ?Sized,
    F: Future<Output = std::result::Result<T, E>>,
    E: From<Error>,
{
    /// Schedules the release if the scope is dropped before its exit completes.
    struct OnDrop<'a, L: Lockable + ?Sized> {
        lock: &'a L,
        armed: bool,
    }
    impl<L: Lockable + ?Sized> Drop for OnDrop<'_, L> {
        fn drop(&mut self) {
            if self.armed {
                self.lock.release_in_background();
            }
        }
    }
    let mut on_drop = OnDrop { lock, armed: took };
    let ended = {
        let body = AssertUnwindSafe(body).catch_unwind();
        tokio::pin!(body);
        tokio::select! {
            biased;
            out = &mut body => match out {
                Ok(out) => Ended::Returned(out),
                Err(panic) => Ended::Panicked(panic),
            },
            lost = monitor.lost() => Ended::Stopped(lost),
        }
    };
    drop(monitor);
    let known_loss = lock.lost_reason();
    let released = if took {
        Some(lock.release().await)
    } else {
        None
    };
    on_drop.armed = false;
    let resource = lock.resource();
    // Only the warnings below need it: not built on the way out of every scope.
    let store = || lock.store_name().unwrap_or_default();
    let lost_anyway = match (&released, known_loss) {
        (Some(Ok(Release::Lost)), reason) => Some(reason.unwrap_or(LostReason::Removed)),
        (None, Some(reason)) => Some(reason),
        _ => None,
    };
    let release_error = match released {
        Some(Err(err)) => Some(err),
        _ => None,
    };
    match ended {
        Ended::Panicked(panic) => {
            if let Some(err) = release_error {
                tracing::warn!(target: TARGET, resource, store = store(), error = %err,
                    "failed to release the lock after the scope panicked");
            }
            std::panic::resume_unwind(panic)
        }
        Ended::Stopped(lost) => {
            tracing::warn!(target: TARGET, resource, store = store(), reason = %lost.reason,
                "the lock was lost: the scope's body was stopped");
            if let Some(err) = release_error {
                tracing::warn!(target: TARGET, resource, store = store(), error = %err,
                    "failed to release the lock after it was lost");
            }
            Err(E::from(Error::from(lost)))
        }
        Ended::Returned(Err(body_err)) => {
            // The body's error wins; a release failure or a loss is reported here.
            if let Some(err) = release_error {
                tracing::warn!(target: TARGET, resource, store = store(), error = %err,
                    "failed to release the lock after the scope failed");
            }
            if let Some(reason) = lost_anyway {
                tracing::warn!(target: TARGET, resource, store = store(), reason = %reason,
                    "the lock was lost while the scope ran");
            }
            Err(body_err)
        }
        Ended::Returned(Ok(value)) => match (release_error, lost_anyway) {
            (Some(err), _) => Err(E::from(err)),
            (None, Some(reason)) => {
                tracing::warn!(target: TARGET, resource, store = store(), reason = %reason,
                    "the lock was lost while the scope ran: its result is not returned");
                Err(E::from(Error::lost(resource, reason)))
            }
            (None, None) => Ok(value),
        },
    }
}
