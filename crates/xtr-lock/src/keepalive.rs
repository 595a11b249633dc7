//! [`KeepAlive`]: automatic renewal of a held lock, with a lost-lock signal.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, ErrorKind, Result};
use crate::lock::{Lock, TARGET};

/// Why a kept-alive lock was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// A refresh found the lock gone or held by someone else (expired and taken over, deleted
    /// behind the holder's back).
    TakenOver,
    /// The lifetime ran out before a refresh could be confirmed.
    Expired,
    /// The store could not be reached until the lifetime ran out.
    Unreachable,
}

/// The lost-lock signal of a [`KeepAlive`].
#[derive(Debug, Clone)]
pub struct LockLost {
    /// The resource.
    pub resource: String,
    /// Why.
    pub reason: LostReason,
    /// The error that showed it.
    pub error: Option<Arc<Error>>,
}

impl fmt::Display for LockLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.reason {
            LostReason::TakenOver => "someone else holds it now",
            LostReason::Expired => "its lifetime ran out before a refresh was confirmed",
            LostReason::Unreachable => "the store could not be reached before its lifetime ran out",
        };
        write!(
            f,
            "lock {} was lost: {why}",
            crate::error::ShownResource(&self.resource)
        )
    }
}

/// Refreshes a held lock in the background, at a third of its ttl, until it is released, the
/// `KeepAlive` is dropped or [stopped](KeepAlive::stop), or the lock is lost, which
/// [`lost`](KeepAlive::lost) reports.
///
/// Made by [`Lock::keep_alive`]. Refresh failures that may pass (an unreachable server) are
/// retried more often while lifetime remains; the lock counts as lost once it ran out.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use std::time::Duration;
/// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
/// let lock = factory.create_lock("long-report").with_ttl(Some(Duration::from_secs(30)));
/// lock.acquire().await?;
/// let mut alive = lock.keep_alive()?;
/// tokio::select! {
///     lost = alive.lost() => eprintln!("{lost}: stopping the work"),
///     () = async { /* the long work */ } => {}
/// }
/// lock.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a KeepAlive stops the renewal"]
pub struct KeepAlive {
    lost: watch::Receiver<Option<LockLost>>,
    task: tokio::task::JoinHandle<()>,
}

impl KeepAlive {
    pub(crate) fn start(lock: &Lock) -> Result<KeepAlive> {
        let Some(ttl) = lock.ttl() else {
            return Err(Error::invalid_argument(
                "keep_alive needs a lock with a ttl: there is nothing to renew",
            )
            .with_resource(lock.resource()));
        };
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::new(ErrorKind::Unsupported)
                .with_reason("keep_alive needs a tokio runtime to refresh from")
                .with_resource(lock.resource())
        })?;
        let (tx, rx) = watch::channel(None);
        let task = handle.spawn(renew(lock.clone(), ttl, tx));
        Ok(KeepAlive { lost: rx, task })
    }

    /// Completes when the lock is lost, with why. Pending forever while it is kept, and after
    /// a release or [`stop`](KeepAlive::stop) (so it can sit in a `select!` next to the work).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping it misses nothing; a later call reports the same loss.
    pub async fn lost(&mut self) -> LockLost {
        loop {
            if let Some(lost) = self.lost.borrow_and_update().clone() {
                return lost;
            }
            if self.lost.changed().await.is_err() {
                // The renewal ended without a loss (released or stopped): never completes.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Whether the lock has been lost (no waiting).
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Stops renewing; the lock stays held until its ttl runs out or it is released.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepAlive")
            .field("lost", &self.is_lost())
            .finish()
    }
}

async fn renew(lock: Lock, ttl: Duration, lost: watch::Sender<Option<LockLost>>) {
    let clock = lock.key().clock().clone();
    let period = ttl / 3;
    let mut wait = period;
    loop {
        clock.sleep(wait).await;
        if lock.held_mode().is_none() {
            return; // released: nothing to keep
        }
        let reason = match lock.refresh(None).await {
            Ok(()) => {
                wait = period;
                continue;
            }
            Err(err) if err.is_conflict() => (LostReason::TakenOver, err),
            Err(err) if err.is_expired() => (LostReason::Expired, err),
            Err(err) => match lock.remaining_lifetime() {
                // It may pass: try again sooner, while the lease lasts.
                Some(left) if !left.is_zero() => {
                    tracing::warn!(target: TARGET, resource = lock.resource(), error = %err,
                        "could not refresh the lock; retrying while it lasts");
                    wait = (period / 4).max(Duration::from_millis(10)).min(left);
                    continue;
                }
                // A store without lifetimes: nothing runs out while it is unreachable.
                None if err.is_temporary() => {
                    wait = (period / 4).max(Duration::from_millis(10));
                    continue;
                }
                _ => (LostReason::Unreachable, err),
            },
        };
        tracing::warn!(target: TARGET, resource = lock.resource(), error = %reason.1,
            "the lock was lost while kept alive");
        let _ = lost.send(Some(LockLost {
            resource: lock.resource().to_owned(),
            reason: reason.0,
            error: Some(Arc::new(reason.1)),
        }));
        return;
    }
}
