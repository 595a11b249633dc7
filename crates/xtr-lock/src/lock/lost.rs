//! What a holder is told when its lock is lost: [`LockLost`], published by a [`KeepAlive`].
//!
//! The task behind a `KeepAlive` (renewal and loss watching) is started by
//! [`Lockable::keep_alive`](crate::Lockable::keep_alive) on a lock (the lock's `monitor` module);
//! this module only
//! holds what the lock's users see, so that everything can name it without depending on the
//! lock.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

use crate::error::{Error, LostReason, ShownResource};

/// The lost-lock signal: which lock, why, and the error that showed it.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "a lost lock no longer protects the work"]
pub struct LockLost {
    /// The resource.
    pub resource: String,
    /// Why.
    pub reason: LostReason,
    /// The error that showed it, where an error did (a refresh that failed until the lease ran
    /// out).
    pub error: Option<Arc<Error>>,
}

impl LockLost {
    /// The lock on `resource` was lost for `reason`.
    pub fn new(resource: impl Into<String>, reason: LostReason) -> Self {
        LockLost {
            resource: resource.into(),
            reason,
            error: None,
        }
    }

    /// With the error that showed it.
    pub fn with_error(mut self, error: Error) -> Self {
        self.error = Some(Arc::new(error));
        self
    }
}

impl fmt::Display for LockLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lock {} was lost: {}",
            ShownResource(&self.resource),
            self.reason
        )
    }
}

impl From<LockLost> for Error {
    fn from(lost: LockLost) -> Error {
        let err = Error::lost(lost.resource, lost.reason);
        match lost.error {
            // `Arc<Error>` is itself an error, with the cause's display and source.
            Some(cause) => err.with_source(cause),
            None => err,
        }
    }
}

/// Keeps a held lock alive and watches for its loss, in the background, until the lock is
/// released, the `KeepAlive` is dropped or [stopped](KeepAlive::stop), or the lock is lost,
/// which [`lost`](KeepAlive::lost) reports.
///
/// Made by [`keep_alive`](crate::Lockable::keep_alive) (a [`LockGuard`](crate::LockGuard) and
/// the scoped forms make one for you). What it does depends on the store:
///
/// - where locks expire, it refreshes at a third of the ttl (unless the lock opted out with
///   [`with_keep_alive(false)`](crate::Lock::with_keep_alive): then it reports the lock lost when
///   its lifetime ends); refresh failures that may pass (an unreachable server) are retried more
///   often while lifetime remains, and the lock counts as lost once it ran out;
/// - where the store observes loss ([`observes_loss`](crate::store::Capabilities::observes_loss)),
///   it reports a loss as the store sees it (a replaced lock file, a closed connection);
/// - where neither applies, it checks once a second.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use std::time::Duration;
/// use xtr_lock::Lockable as _;
/// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
/// let lock = factory.create_lock("long-report").with_ttl(Duration::from_secs(30));
/// lock.acquire().await?;
/// let alive = lock.keep_alive()?;
/// tokio::select! {
///     lost = alive.lost() => eprintln!("{lost}: stopping the work"),
///     () = async { /* the long work */ } => {}
/// }
/// let _ = lock.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a KeepAlive stops the renewal"]
pub struct KeepAlive {
    lost: watch::Receiver<Option<LockLost>>,
    task: Option<tokio::task::AbortHandle>,
}

impl KeepAlive {
    /// A `KeepAlive` fed by `lost`, whose work is `task` (aborted when this goes).
    pub(crate) fn new(
        lost: watch::Receiver<Option<LockLost>>,
        task: Option<tokio::task::AbortHandle>,
    ) -> Self {
        KeepAlive { lost, task }
    }

    /// A `KeepAlive` with nothing to keep: [`lost`](KeepAlive::lost) never completes. What a
    /// [`NoLock`](crate::NoLock) gives.
    pub fn inert() -> Self {
        let (_, rx) = watch::channel(None);
        KeepAlive {
            lost: rx,
            task: None,
        }
    }

    /// Completes when the lock is lost, with why. Pending forever while it is kept, and after
    /// a release or [`stop`](KeepAlive::stop) (so it can sit in a `select!` next to the work).
    ///
    /// The future owns what it watches: it borrows nothing, so it can be awaited while the
    /// `KeepAlive` is used otherwise, moved into a task, or made again at each step.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping it misses nothing; a later call reports the same loss.
    pub fn lost(&self) -> impl Future<Output = LockLost> + Send + 'static {
        let mut lost = self.lost.clone();
        async move {
            loop {
                if let Some(lost) = lost.borrow_and_update().clone() {
                    return lost;
                }
                if lost.changed().await.is_err() {
                    // The work ended without a loss (released or stopped): never completes.
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// The loss, if the lock has been lost (no waiting).
    pub fn lost_now(&self) -> Option<LockLost> {
        self.lost.borrow().clone()
    }

    /// Whether the lock has been lost (no waiting).
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Stops renewing and watching; the lock stays held until its ttl runs out or it is
    /// released.
    pub fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepAlive")
            .field("lost", &self.is_lost())
            .field(
                "running",
                &self.task.as_ref().is_some_and(|t| !t.is_finished()),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_loss_turned_into_an_error_keeps_the_error_that_showed_it() {
        let cause = Error::storage("connection refused").with_store("redis://h");
        let err: Error = LockLost::new("r", LostReason::Expired)
            .with_error(cause)
            .into();
        assert!(err.is_lost());
        assert_eq!(err.lost_reason(), Some(LostReason::Expired));
        let src = err.source().expect("the cause is the source");
        assert_eq!(src.to_string(), "connection refused (store redis://h)");

        let bare: Error = LockLost::new("r", LostReason::Removed).into();
        assert!(bare.source().is_none());
    }
}
