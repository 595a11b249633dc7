//! Scopes: take a lock, run a body while the lock is kept alive and watched, and let it go on
//! the way out. Every async `scoped` and `scoped_read` ([`Lock`]'s, `dyn Lockable`'s,
//! [`NoLock`]'s, [`LockableExt`]'s) is the one function `scope`. Guards (`guard.rs`, and
//! through them the blocking API's) are taken by the same `enter`; a guard's `run` leaves by
//! `run_scope`.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt as _;

use super::Lock;
use super::lockable::{Lockable, NoLock, Release};
use super::lost::{KeepAlive, LockLost};
use crate::error::{Error, LostReason, Result};
use crate::key::Mode;
use crate::logging::TARGET;

/// Takes the lock in `mode` for a scope or a guard and starts its monitor: whether this scope
/// took the lock (and must let it go), and the monitor.
///
/// A holder that already holds the lock keeps it as it is (nesting): one holding the write lock
/// is not demoted by a read scope (the write lock covers reading), one holding the read lock
/// re-asserts it.
pub(crate) async fn enter<L: Lockable + ?Sized>(lock: &L, mode: Mode) -> Result<(bool, KeepAlive)> {
    let took = match (mode, lock.held_mode()) {
        (Mode::Write, held) => {
            lock.acquire().await?;
            held.is_none()
        }
        (Mode::Read, Some(Mode::Write)) => false,
        (Mode::Read, held) => {
            lock.acquire_read().await?;
            held.is_none()
        }
    };
    let monitor = start_monitor(lock, took).await?;
    Ok((took, monitor))
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

/// The one scope: takes the lock in `mode`, runs `body` while it is kept alive, and lets it go
/// on the way out (see [`Lock::scoped`]).
async fn scope<L, T, E, F>(lock: &L, mode: Mode, body: F) -> std::result::Result<T, E>
where
    L: Lockable + ?Sized,
    F: Future<Output = std::result::Result<T, E>>,
    E: From<Error>,
{
    let (took, monitor) = enter(lock, mode).await?;
    run_scope(lock, took, monitor, body).await
}

/// How a scope's body ended.
enum Ended<T, E> {
    Returned(std::result::Result<T, E>),
    Panicked(Box<dyn std::any::Any + Send>),
    /// Dropped: its lock was lost.
    Stopped(LockLost),
}

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
    let mut on_drop = OnDrop { lock, armed: took };
    let ended = watched(body, &mut monitor).await;
    drop(monitor);
    let known_loss = lock.lost_reason();
    let released = if took {
        Some(lock.release().await)
    } else {
        None
    };
    on_drop.armed = false;
    Exit::new(released, known_loss).outcome(lock, ended)
}

/// Runs `body` until it ends, or until `monitor` reports the lock lost (then the body is
/// dropped where it stands).
async fn watched<T, E, F>(body: F, monitor: &mut KeepAlive) -> Ended<T, E>
where
    F: Future<Output = std::result::Result<T, E>>,
{
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
}

/// What a scope's way out found besides its body's end: the release's error, and a loss the
/// body did not see (known before the release, or found by it).
struct Exit {
    release_error: Option<Error>,
    lost_anyway: Option<LostReason>,
}

impl Exit {
    /// From the release (`None` when the scope did not take the lock) and the loss the holder
    /// knew of before it.
    fn new(released: Option<Result<Release>>, known_loss: Option<LostReason>) -> Self {
        let lost_anyway = match (&released, known_loss) {
            (Some(Ok(Release::Lost)), reason) => Some(reason.unwrap_or(LostReason::Removed)),
            (None, Some(reason)) => Some(reason),
            _ => None,
        };
        let release_error = match released {
            Some(Err(err)) => Some(err),
            _ => None,
        };
        Exit {
            release_error,
            lost_anyway,
        }
    }

    /// What the scope returns: a panic goes on, a stopped body is `Lost`, the body's error wins
    /// over a release error or a loss (logged instead), and a value is returned only if the
    /// lock was released cleanly and never lost.
    fn outcome<L, T, E>(self, lock: &L, ended: Ended<T, E>) -> std::result::Result<T, E>
    where
        L: Lockable + ?Sized,
        E: From<Error>,
    {
        let resource = lock.resource();
        // Only the warnings below need it: not built on the way out of every scope.
        let store = || lock.store_name().unwrap_or_default();
        let Exit {
            release_error,
            lost_anyway,
        } = self;
        match ended {
            Ended::Panicked(panic) => {
                if let Some(err) = release_error {
                    tracing::warn!(target: TARGET, resource, store = store(), error = %err,
                        "failed to release the lock after the scope panicked");
                }
                std::panic::resume_unwind(panic)
            }
            Ended::Stopped(mut lost) => {
                // Told it held too long, then found lost by its release: the loss is the news
                // (the lock may have been someone else's before the body stopped).
                if let (LostReason::HeldTooLong, Some(reason)) = (lost.reason, lost_anyway) {
                    lost = LockLost::new(resource, reason);
                }
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
}

impl Lock {
    /// Waits for the write lock, runs `body` while keeping the lock alive, and releases the lock
    /// on the way out, also when the body fails, panics or is cancelled, unless this holder
    /// already held the lock when the scope began (nesting).
    ///
    /// **A body whose lock is lost is stopped**: it is dropped at its next `.await` and the call
    /// returns [`ErrorKind::Lost`](crate::ErrorKind::Lost) (as a command under `xtr-lock run` is
    /// stopped). A body that completes although its lock was lost meanwhile does not return
    /// `Ok` either: the release finds nothing and the call returns `Lost`. To decide yourself
    /// where work can stop, hold a [`LockGuard`](crate::LockGuard) and select on
    /// [`LockGuard::lost`](crate::LockGuard::lost).
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
        scope(self, Mode::Write, body).await
    }

    /// Waits for the read lock, runs `body` while keeping the lock alive, and releases it on the
    /// way out, as [`Lock::scoped`] does for the write lock (a body whose lock is lost is
    /// stopped and the call returns [`ErrorKind::Lost`](crate::ErrorKind::Lost)). On a store
    /// without shared locks this takes the write lock (see
    /// [`acquire_with`](crate::Lockable::acquire_with)).
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
        scope(self, Mode::Read, body).await
    }
}

impl NoLock {
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
        // A no-op lock is always held and never lost: the scope takes nothing and only runs
        // the body.
        scope(self, Mode::Write, body).await
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
        scope(self, Mode::Write, body).await
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
        scope(self, Mode::Read, body).await
    }
}

/// Scopes on any lock type: `scoped` and `scoped_read` for every [`Lockable`] (a [`Lock`], a
/// `dyn Lockable`, [`NoLock`]), so generic code can use them.
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
        scope(self, Mode::Write, body)
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
        scope(self, Mode::Read, body)
    }
}

impl<L: Lockable + ?Sized> LockableExt for L {}
