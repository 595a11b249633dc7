//! Clocks: lifetimes are durations on a monotonic clock, and retry sleeps run on the same clock.
//!
//! [`MonotonicClock`] is the default. [`ManualClock`] makes expiry deterministic in tests: time
//! moves only when the test says so, or when a sleep on it asks to (auto-advance).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::mutex::lock;
use tokio::sync::watch;

/// The whole seconds of `d`, rounded up (saturating): what a store that counts whole seconds
/// must keep so as never to keep less.
pub(crate) fn seconds_up(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// A boxed `Send` future, as returned by object-safe traits of this crate.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A monotonic clock with an asynchronous sleep.
///
/// A [`LockFactory`](crate::LockFactory) hands its clock to every key it makes (lifetimes) and
/// every lock (retry sleeps).
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant. Never goes backwards.
    fn now(&self) -> Instant;

    /// Completes once `d` has passed on this clock.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future cancels the sleep; nothing else happens.
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()>;
}

/// The default clock: [`Instant::now`] and [`tokio::time::sleep`].
///
/// Wall-clock jumps change nothing. Under tokio's paused test time
/// (`tokio::time::pause`) sleeps follow the paused time, but `now` does not; use
/// [`ManualClock`] for deterministic lifetimes.
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// A clock that moves only when told to: for tests.
///
/// - [`advance`](ManualClock::advance) moves time forward and wakes the sleepers whose time came.
/// - With [`auto_advance`](ManualClock::auto_advance) (the default of [`ManualClock::new`]), a
///   sleep moves the clock forward itself and completes at once (after yielding to the
///   scheduler), so retry loops run instantly and their total sleep can be read back with
///   [`slept`](ManualClock::slept).
/// - With [`ManualClock::frozen`], sleeps wait until a test advances the clock: a waiter can then
///   only be woken by a notification, which is how the tests prove waking on release.
///
/// Clones share one timeline.
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

struct ManualInner {
    origin: Instant,
    state: Mutex<ManualState>,
    tick: watch::Sender<Duration>,
}

struct ManualState {
    offset: Duration,
    auto_advance: bool,
    slept: Duration,
    sleeps: Vec<Duration>,
}

impl ManualClock {
    /// A clock starting now whose sleeps advance it (instant waits).
    pub fn new() -> Self {
        Self::with_auto_advance(true)
    }

    /// A clock starting now whose sleeps wait for [`advance`](ManualClock::advance).
    pub fn frozen() -> Self {
        Self::with_auto_advance(false)
    }

    fn with_auto_advance(auto_advance: bool) -> Self {
        let (tick, _) = watch::channel(Duration::ZERO);
        ManualClock {
            inner: Arc::new(ManualInner {
                origin: Instant::now(),
                state: Mutex::new(ManualState {
                    offset: Duration::ZERO,
                    auto_advance,
                    slept: Duration::ZERO,
                    sleeps: Vec::new(),
                }),
                tick,
            }),
        }
    }

    /// Switches auto-advance on or off.
    pub fn auto_advance(&self, on: bool) {
        self.state().auto_advance = on;
    }

    /// Moves the clock forward by `d` and wakes the sleepers whose time came.
    pub fn advance(&self, d: Duration) {
        let offset = {
            let mut st = self.state();
            st.offset += d;
            st.offset
        };
        self.inner.tick.send_replace(offset);
    }

    /// The total of all sleeps started on this clock.
    pub fn slept(&self) -> Duration {
        self.state().slept
    }

    /// Each sleep started on this clock, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        self.state().sleeps.clone()
    }

    /// How far the clock has moved since it was made.
    pub fn elapsed(&self) -> Duration {
        self.state().offset
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ManualState> {
        lock(&self.inner.state)
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state();
        f.debug_struct("ManualClock")
            .field("elapsed", &st.offset)
            .field("auto_advance", &st.auto_advance)
            .finish()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.inner.origin + self.state().offset
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        let (target, auto) = {
            let mut st = self.state();
            st.slept += d;
            st.sleeps.push(d);
            (st.offset + d, st.auto_advance)
        };
        if auto {
            let clock = self.clone();
            return Box::pin(async move {
                // Only move forward: a concurrent sleeper may already have gone further.
                let now = clock.elapsed();
                if target > now {
                    clock.advance(target - now);
                }
                tokio::task::yield_now().await;
            });
        }
        let mut rx = self.inner.tick.subscribe();
        Box::pin(async move {
            loop {
                if *rx.borrow_and_update() >= target {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn auto_advance_sleeps_move_time() {
        let c = ManualClock::new();
        let t0 = c.now();
        c.sleep(Duration::from_millis(100)).await;
        c.sleep(Duration::from_millis(50)).await;
        assert_eq!(c.now() - t0, Duration::from_millis(150));
        assert_eq!(c.slept(), Duration::from_millis(150));
        assert_eq!(c.sleeps().len(), 2);
    }

    #[tokio::test]
    async fn frozen_sleeps_wait_for_advance() {
        let c = ManualClock::frozen();
        let sleep = c.sleep(Duration::from_secs(5));
        let c2 = c.clone();
        let h = tokio::spawn(sleep);
        tokio::task::yield_now().await;
        c2.advance(Duration::from_secs(4));
        tokio::task::yield_now().await;
        assert!(!h.is_finished());
        c2.advance(Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .expect("woken")
            .expect("no panic");
    }
}
