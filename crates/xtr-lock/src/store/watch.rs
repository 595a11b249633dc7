//! What stores hand out to be awaited: a [`Watcher`] of releases on a resource, a
//! [`LossWatcher`] of one holder's lock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
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
/// A watcher either sees **every** release ([`Watcher::new`]: the lock then does not poll), or
/// only some ([`Watcher::best_effort`]: for example Redis, where peers in other languages release
/// without publishing; the lock then keeps polling as a safety net).
#[must_use = "a watcher does nothing unless awaited"]
pub struct Watcher {
    fut: BoxFuture<'static, ()>,
    complete: bool,
}

impl Watcher {
    /// Wraps a future that completes on the next change; the store observes every release.
    pub fn new(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Watcher {
            fut: Box::pin(fut),
            complete: true,
        }
    }

    /// Wraps a future that completes on the next change the store happens to observe; some
    /// releases go unseen, so waiters also poll.
    pub fn best_effort(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Watcher {
            fut: Box::pin(fut),
            complete: false,
        }
    }

    /// Whether every release on the resource completes this watcher.
    pub fn sees_every_release(&self) -> bool {
        self.complete
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
            .field("sees_every_release", &self.complete)
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
