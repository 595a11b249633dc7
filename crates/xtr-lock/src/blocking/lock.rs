//! The blocking [`Lock`], [`LockGuard`] and [`KeepAlive`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::rt::Rt;
use crate::error::{Error, LostReason, Result};
use crate::key::Mode;
use crate::lock::lockable::{Lockable as _, Release, Wait};
use crate::lock::lost::LockLost;
use crate::logging::TARGET;

/// A lock for code without an async runtime: the operations of [`crate::Lock`], blocking the
/// calling thread. Clones are the same holder.
///
/// Made by a [`LockFactory`](super::LockFactory) or [`Locks`](super::Locks). Every method
/// refuses with [`Unsupported`](crate::ErrorKind::Unsupported) when called inside a tokio
/// runtime.
#[derive(Clone)]
pub struct Lock {
    pub(super) inner: crate::Lock,
    pub(super) rt: Arc<Rt>,
}

impl Lock {
    /// The resource.
    pub fn resource(&self) -> &str {
        self.inner.resource()
    }

    /// The same holder with another ttl: a `Duration`, or `None` (or zero) for no lifetime;
    /// as [`crate::Lock::with_ttl`].
    #[must_use]
    pub fn with_ttl(mut self, ttl: impl Into<Option<Duration>>) -> Self {
        self.inner = self.inner.with_ttl(ttl);
        self
    }

    /// Whether guards and scopes renew an expiring lock (the default); as
    /// [`crate::Lock::with_keep_alive`].
    #[must_use]
    pub fn with_keep_alive(mut self, renew: bool) -> Self {
        self.inner = self.inner.with_keep_alive(renew);
        self
    }

    /// The lifetime each acquisition gets, if any.
    pub fn ttl(&self) -> Option<Duration> {
        self.inner.ttl()
    }

    /// Takes the lock in `mode`, waiting as `wait` says: `Ok(false)` when someone else holds
    /// it and the wait ran out, as [`Lockable::acquire_with`](crate::Lockable::acquire_with).
    /// A wait that runs out leaves nothing held (the async API's cancel safety).
    ///
    /// # Errors
    ///
    /// As [`Lockable::acquire_with`](crate::Lockable::acquire_with); `Unsupported` inside a
    /// tokio runtime.
    pub fn acquire_with(&self, mode: Mode, wait: Wait) -> Result<bool> {
        self.rt.run(self.inner.acquire_with(mode, wait))?
    }

    /// Tries once to take the write lock.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    pub fn try_acquire(&self) -> Result<bool> {
        self.acquire_with(Mode::Write, Wait::Never)
    }

    /// Waits until the write lock is taken.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    pub fn acquire(&self) -> Result<()> {
        self.acquire_with(Mode::Write, Wait::Forever).map(|_| ())
    }

    /// Waits up to `wait` for the write lock: `Ok(false)` if it did not come, and then nothing
    /// is held.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    pub fn acquire_timeout(&self, wait: Duration) -> Result<bool> {
        self.acquire_with(Mode::Write, Wait::AtMost(wait))
    }

    /// Tries once to take a read lock. On a store without shared locks this takes the write
    /// lock (see [`Lockable::acquire_with`](crate::Lockable::acquire_with)).
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    pub fn try_acquire_read(&self) -> Result<bool> {
        self.acquire_with(Mode::Read, Wait::Never)
    }

    /// Waits until a read lock is taken. On a store without shared locks this takes the write
    /// lock (see [`Lockable::acquire_with`](crate::Lockable::acquire_with)).
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    pub fn acquire_read(&self) -> Result<()> {
        self.acquire_with(Mode::Read, Wait::Forever).map(|_| ())
    }

    /// Waits up to `wait` for a read lock. On a store without shared locks this takes the write
    /// lock (see [`Lockable::acquire_with`](crate::Lockable::acquire_with)).
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    pub fn acquire_read_timeout(&self, wait: Duration) -> Result<bool> {
        self.acquire_with(Mode::Read, Wait::AtMost(wait))
    }

    /// Extends the lifetime, as [`Lockable::refresh`](crate::Lockable::refresh).
    ///
    /// # Errors
    ///
    /// As [`Lockable::refresh`](crate::Lockable::refresh); `Unsupported` inside a runtime.
    pub fn refresh(&self, ttl: Option<Duration>) -> Result<()> {
        self.rt.run(self.inner.refresh(ttl))?
    }

    /// Releases the lock and says what it found, as [`Lockable::release`](crate::Lockable::release).
    ///
    /// # Errors
    ///
    /// As [`Lockable::release`](crate::Lockable::release); `Unsupported` inside a runtime.
    pub fn release(&self) -> Result<Release> {
        self.rt.run(self.inner.release())?
    }

    /// Asks the store whether this holder holds the lock.
    ///
    /// # Errors
    ///
    /// A store error; `Unsupported` inside a runtime.
    pub fn is_acquired(&self) -> Result<bool> {
        self.rt.run(self.inner.is_acquired())?
    }

    /// How this holder believes it holds the lock (no store call).
    pub fn held_mode(&self) -> Option<Mode> {
        self.inner.held_mode()
    }

    /// Why the lock was found lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.inner.lost_reason()
    }

    /// The lifetime left, on stores where locks expire.
    pub fn remaining_lifetime(&self) -> Option<Duration> {
        self.inner.remaining_lifetime()
    }

    /// The fencing token of the hold, where the store gives one.
    pub fn fencing_token(&self) -> Option<u64> {
        self.inner.fencing_token()
    }

    /// Keeps the held lock alive in the background (renewed at a third of its ttl) and watches
    /// it; see [`KeepAlive`].
    ///
    /// # Errors
    ///
    /// As [`Lockable::keep_alive`](crate::Lockable::keep_alive).
    pub fn keep_alive(&self) -> Result<KeepAlive> {
        let inner = self.rt.enter(|| self.inner.keep_alive())?;
        Ok(KeepAlive {
            inner,
            rt: self.rt.clone(),
        })
    }

    /// Waits for the write lock and returns a guard that keeps it alive, tells when it is lost
    /// and releases it when dropped (before `drop` returns).
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::lock`]; `Unsupported` inside a runtime.
    pub fn lock(&self) -> Result<LockGuard> {
        let inner = self.rt.run(self.inner.lock())??;
        Ok(self.guard(inner))
    }

    /// Waits for the read lock and returns a guard, as [`crate::Lock::lock_read`].
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    pub fn lock_read(&self) -> Result<LockGuard> {
        let inner = self.rt.run(self.inner.lock_read())??;
        Ok(self.guard(inner))
    }

    fn guard(&self, inner: crate::LockGuard) -> LockGuard {
        LockGuard {
            inner: Some(inner),
            rt: self.rt.clone(),
        }
    }

    /// Waits for the write lock, runs `body` on this thread while the lock is kept alive, and
    /// releases it on the way out (also when `body` fails or panics). A body that returns after
    /// its lock was lost does not return `Ok`: the call returns
    /// [`Lost`](crate::ErrorKind::Lost) (a blocking body cannot be stopped midway: check
    /// [`LockGuard::is_lost`] between steps, through [`lock`](Self::lock), where that matters).
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

    /// As [`scoped`](Self::scoped) under the read lock.
    ///
    /// # Errors
    ///
    /// As [`scoped`](Self::scoped).
    pub fn scoped_read<T, E, F>(&self, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce() -> std::result::Result<T, E>,
        E: From<Error>,
    {
        self.lock_read()?.run(body)
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::Lock").field(&self.inner).finish()
    }
}

/// A held lock, kept alive, watched, and released when dropped (the drop waits for the
/// release; dropped inside a tokio runtime it schedules it instead).
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    pub(super) inner: Option<crate::LockGuard>,
    pub(super) rt: Arc<Rt>,
}

impl LockGuard {
    fn inner(&self) -> &crate::LockGuard {
        self.inner
            .as_ref()
            .expect("a guard is only emptied when it goes")
    }

    /// Whether the lock has been lost (no waiting).
    pub fn is_lost(&self) -> bool {
        self.inner().is_lost()
    }

    /// Waits up to `timeout` for the lock to be lost: `Some` with why, or `None` if it is still
    /// held. A loss that happened before is reported at once.
    ///
    /// # Errors
    ///
    /// `Unsupported` inside a tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<Option<LockLost>> {
        let lost = self.inner().lost();
        self.rt
            .run(async { tokio::time::timeout(timeout, lost).await.ok() })
    }

    /// The fencing token of the hold, where the store gives one.
    pub fn fencing_token(&self) -> Option<u64> {
        self.inner().fencing_token()
    }

    /// Whether this guard took the lock (rather than finding its holder holding it already).
    pub fn took(&self) -> bool {
        self.inner().took()
    }

    /// Releases now and says what it found, as [`crate::LockGuard::unlock`].
    ///
    /// # Errors
    ///
    /// The release's error; `Unsupported` inside a tokio runtime (the guard is then dropped,
    /// which schedules the release).
    pub fn unlock(mut self) -> Result<Release> {
        let inner = self
            .inner
            .take()
            .expect("a guard is only emptied when it goes");
        match super::rt::outside_runtime() {
            Ok(()) => self.rt.run(inner.unlock())?,
            Err(err) => {
                self.rt.enter(|| drop(inner));
                Err(err)
            }
        }
    }

    /// Gives up the guard and its renewal; the lock stays held.
    pub fn keep(mut self) -> Lock {
        let inner = self
            .inner
            .take()
            .expect("a guard is only emptied when it goes");
        Lock {
            inner: inner.keep(),
            rt: self.rt.clone(),
        }
    }

    /// The guard of a lock just taken by `run`, with its renewal.
    pub(super) fn from_parts(lock: &Lock, monitor: crate::KeepAlive) -> LockGuard {
        LockGuard {
            inner: Some(crate::LockGuard::new(lock.inner.clone(), true, monitor)),
            rt: lock.rt.clone(),
        }
    }

    pub(super) fn run<T, E, F>(self, body: F) -> std::result::Result<T, E>
    where
        F: FnOnce() -> std::result::Result<T, E>,
        E: From<Error>,
    {
        let lock = self.inner().lock().clone();
        let resource = lock.resource().to_owned();
        // A panic unwinds through the guard, whose drop releases.
        let out = body();
        let released = self.unlock();
        match (out, released) {
            (Err(body_err), released) => {
                if let Err(err) = released {
                    tracing::warn!(target: TARGET, resource, error = %err,
                        "failed to release the lock after the scope failed");
                }
                Err(body_err)
            }
            (Ok(_), Ok(Release::Lost)) => {
                tracing::warn!(target: TARGET, resource,
                    "the lock was lost while the scope ran: its result is not returned");
                let reason = crate::Lockable::lost_reason(&lock).unwrap_or(LostReason::Removed);
                Err(E::from(Error::lost(resource, reason)))
            }
            (Ok(value), Ok(_)) => Ok(value),
            (Ok(_), Err(err)) => Err(E::from(err)),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        if super::rt::outside_runtime().is_ok() {
            match self.rt.run(inner.unlock()) {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => tracing::warn!(target: TARGET, error = %err,
                    "failed to release the lock when its guard was dropped"),
                Err(_) => {}
            }
        } else {
            // Inside some runtime: the async guard's drop schedules the release on ours.
            self.rt.enter(|| drop(inner));
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LockGuard")
            .field(&self.inner)
            .finish()
    }
}

/// Renewal and loss watching of a held lock, in the background; dropping it stops both.
#[must_use = "dropping a KeepAlive stops the renewal"]
pub struct KeepAlive {
    inner: crate::KeepAlive,
    rt: Arc<Rt>,
}

impl KeepAlive {
    /// Whether the lock has been lost (no waiting).
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// Waits up to `timeout` for the lock to be lost: `Some` with why, or `None`.
    ///
    /// # Errors
    ///
    /// `Unsupported` inside a tokio runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<Option<LockLost>> {
        let lost = self.inner.lost();
        self.rt
            .run(async { tokio::time::timeout(timeout, lost).await.ok() })
    }

    /// Stops renewing and watching; the lock stays held until its ttl runs out or it is
    /// released.
    pub fn stop(self) {
        self.inner.stop();
    }
}

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::KeepAlive")
            .field(&self.inner)
            .finish()
    }
}
