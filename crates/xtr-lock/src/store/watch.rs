//! What stores hand out to be awaited: a [`Watcher`] of releases on a resource, a
//! [`LossWatcher`] of one holder's lock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::clock::BoxFuture;
use crate::error::LostReason;

/// A one-shot notification that something changed on a resource (a release, a demotion, an
/// expiry the store noticed).
///
/// It is registered when [`Store::watch`](crate::Store::watch) returns, so a change that happens
/// between that moment and the moment it is awaited is not lost. It may also complete
/// spuriously: waiters always try again and watch again.
///
/// A watcher either sees **every** release ([`Watcher::new`]: the lock then does not poll), only
/// some ([`Watcher::best_effort`]: the lock keeps polling as a safety net), or says after each
/// attempt which of the two holds ([`Watcher::with_coverage`]: Redis sees every release while
/// all the current holders announce theirs, and none of a Python or PHP peer's).
#[must_use = "a watcher does nothing unless awaited"]
pub struct Watcher {
    fut: BoxFuture<'static, ()>,
    coverage: Coverage,
}

/// Whether a watcher sees every release, asked after each attempt.
pub(crate) type Coverage = Arc<dyn Fn() -> bool + Send + Sync>;

impl Watcher {
    /// Wraps a future that completes on the next change; the store observes every release.
    pub fn new(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Self::with_coverage(fut, || true)
    }

    /// Wraps a future that completes on the next change the store happens to observe; some
    /// releases go unseen, so waiters also poll.
    pub fn best_effort(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Self::with_coverage(fut, || false)
    }

    /// Wraps a future that completes on the next change the store observes, with `covers`
    /// telling whether every release is observed now. The [`Lock`](crate::Lock) asks it after
    /// each refused attempt, so a store can answer from what that attempt found (who holds).
    pub fn with_coverage(
        fut: impl Future<Output = ()> + Send + 'static,
        covers: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Self {
        Watcher {
            fut: Box::pin(fut),
            coverage: Arc::new(covers),
        }
    }

    /// Whether every release on the resource completes this watcher.
    pub fn sees_every_release(&self) -> bool {
        (self.coverage)()
    }

    /// The coverage, to be asked after the watcher has gone into a combining future.
    pub(crate) fn coverage(&self) -> Coverage {
        self.coverage.clone()
    }
}

impl Future for Watcher {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.fut.as_mut().poll(cx)
    }
}

impl fmt::Debug for Watcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watcher")
            .field("sees_every_release", &self.sees_every_release())
            .finish_non_exhaustive()
    }
}

/// Completes when the store sees that one holder no longer holds its lock, with why (see
/// [`Store::watch_loss`](crate::Store::watch_loss)).
///
/// It also completes when the holder released the lock itself: the [`Lock`](crate::Lock)
/// decides what a completion means. It never completes merely because the store cannot watch
/// any more; a store that loses its means of watching falls back to checking on its own.
#[must_use = "a loss watcher does nothing unless awaited"]
pub struct LossWatcher {
    fut: BoxFuture<'static, LostReason>,
}

impl LossWatcher {
    /// Wraps a future that yields why the holder's lock is gone, once it is.
    pub fn new(fut: impl Future<Output = LostReason> + Send + 'static) -> Self {
        LossWatcher { fut: Box::pin(fut) }
    }
}

impl Future for LossWatcher {
    type Output = LostReason;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LostReason> {
        self.fut.as_mut().poll(cx)
    }
}

impl fmt::Debug for LossWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossWatcher").finish_non_exhaustive()
    }
}
