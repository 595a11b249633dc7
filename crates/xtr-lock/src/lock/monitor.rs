//! The task behind a [`KeepAlive`]: renews an expiring lock, watches the store for its loss,
//! or checks on it, and publishes a loss once it is confirmed.

use std::time::Duration;

use tokio::sync::watch;

use super::Lock;
use super::lockable::Lockable as _;
use super::lost::{KeepAlive, LockLost};
use crate::error::{Error, ErrorKind, LostReason, Result};
use crate::holder::Hold;
use crate::logging::TARGET;
use crate::store::LossWatcher;

/// How often a lock on a store that neither expires nor observes loss is checked.
const CHECK_EVERY: Duration = Duration::from_secs(1);

pub(super) fn start(lock: &Lock) -> Result<KeepAlive> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        Error::new(ErrorKind::Unsupported)
            .with_reason("keeping a lock alive needs a tokio runtime to run on")
            .with_resource(lock.resource())
    })?;
    let (tx, rx) = watch::channel(None);
    let holder = lock.holder();
    if holder.mode().is_none() || !lock.excludes() {
        // Nothing held (or nothing a store can lose): nothing to keep.
        return Ok(KeepAlive::new(rx, None));
    }
    let generation = holder.generation();
    let task = runtime.spawn(watch_over(lock.clone(), generation, tx));
    Ok(KeepAlive::new(rx, Some(task.abort_handle())))
}

/// What the monitor does between events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Duty {
    /// Refresh to `ttl` every third of the lease the store really keeps (see [`renew_period`]).
    Renew { ttl: Duration },
    /// The lock expires and is not renewed: report it lost when its lifetime ends.
    Expire,
    /// Ask the store every so often (it neither expires nor tells of a loss).
    Check,
    /// Only the store's loss watcher (and the holder's own changes).
    Watch,
}

/// The store's loss watcher (if it has one), the monitor's duty, and when it first acts.
async fn plan(lock: &Lock) -> (Option<LossWatcher>, Duty, Option<Duration>) {
    let caps = lock.store.capabilities();
    let loss: Option<LossWatcher> = match lock.store.watch_loss(&lock.key).await {
        Ok(w) => w,
        Err(err) => {
            tracing::debug!(target: TARGET, resource = lock.resource(), store = %lock.store, error = %err,
                "cannot watch the lock for its loss; checking on it instead");
            None
        }
    };
    let duty = match lock.ttl {
        Some(ttl) if caps.expiring && lock.keep_alive => Duty::Renew { ttl },
        _ if caps.expiring => Duty::Expire,
        _ if caps.observes_loss && loss.is_some() => Duty::Watch,
        _ => Duty::Check,
    };
    let first = match duty {
        Duty::Renew { ttl } => Some(renew_period(lock, ttl)),
        Duty::Expire => lock.key.confirmed_lifetime(),
        Duty::Check => Some(CHECK_EVERY),
        Duty::Watch => None,
    };
    (loss, duty, first)
}

async fn watch_over(lock: Lock, generation: u64, lost: watch::Sender<Option<LockLost>>) {
    let mut changes = lock.holder().subscribe();
    let (mut loss, duty, mut next) = plan(&lock).await;
    let clock = lock.key.clock().clone();
    let _revocation = super::revoke::watch(&lock, generation);
    let mut limits = Limits::new(&lock, generation);
    let mut too_long = limits.left(clock.now()).map(|left| clock.sleep(left));
    // The refresh error that ended the lease, told with the loss it caused.
    let mut cause: Option<Error> = None;
    loop {
        let timer = next.map(|d| clock.sleep(d));
        tokio::select! {
            // A loss seen, then the holder's own changes, then the end of its maximum hold
            // (so a loss is never told as a maximum reached), then the timed duty.
            biased;
            reason = async { loss.as_mut().expect("guarded").await }, if loss.is_some() => {
                loss = None;
                // Confirmed by a call, so the holder's own release still in flight is not
                // taken for a loss.
                let confirmed = lock.lose(generation, reason).await;
                if confirmed {
                    tracing::warn!(target: TARGET, resource = lock.resource(), store = %lock.store, reason = %reason,
                        "the lock was lost");
                }
            }
            changed = changes.changed() => {
                if changed.is_err() {
                    return; // the key is gone
                }
            }
            () = async { too_long.as_mut().expect("guarded").await }, if too_long.is_some() => {
                limits.reached = true;
            }
            () = async { timer.expect("guarded").await }, if timer.is_some() => {
                next = on_timer(&lock, duty, generation, &mut cause, &mut limits).await;
            }
        }
        // Whatever woke us: a released holder (or a new generation) ends the watch quietly; a
        // lost one is published.
        let believed = lock.holder().believed();
        if believed.generation != generation {
            return;
        }
        match believed.hold {
            Hold::Free => return,
            Hold::Lost(reason) => {
                let mut told = LockLost::new(lock.resource(), reason);
                if let Some(err) = cause {
                    told = told.with_error(err);
                }
                let _ = lost.send(Some(told));
                return;
            }
            Hold::Held { .. } if limits.reached => {
                held_too_long(&lock, generation, &lost);
                return;
            }
            Hold::Held { .. } => {}
        }
    }
}

/// A third of the lease the store confirmed last (right after an acquisition or a renewal,
/// about the lease it really keeps: less than the ttl on stores that count whole seconds and
/// take a lock up to 1 s early), and of the ttl when the store sets no deadline; at least 10 ms.
fn renew_period(lock: &Lock, ttl: Duration) -> Duration {
    let lease = lock
        .key
        .confirmed_lifetime()
        .map_or(ttl, |left| left.min(ttl));
    (lease / 3).max(Duration::from_millis(10))
}

/// The holder's maximum hold and renewals, as the monitor counts them.
struct Limits {
    /// When the maximum hold ends, on the key's clock.
    until: Option<std::time::Instant>,
    /// Renewals still allowed.
    renewals: Option<u32>,
    /// A limit was reached: the holder is told, and the monitor ends.
    reached: bool,
}

impl Limits {
    fn new(lock: &Lock, generation: u64) -> Self {
        let now = lock.key.clock().now();
        let held = lock.held_for(generation).unwrap_or_default();
        Limits {
            until: lock.max_hold().map(|max| now + max.saturating_sub(held)),
            renewals: lock.max_renewals(),
            reached: false,
        }
    }

    /// What is left of the maximum hold at `now`.
    fn left(&self, now: std::time::Instant) -> Option<Duration> {
        self.until.map(|until| until.saturating_duration_since(now))
    }

    /// The lifetime a renewal to `ttl` may give (none past the maximum hold but for its
    /// grace), or `None` when no renewal may be made.
    fn renewal(&mut self, lock: &Lock, ttl: Duration) -> Option<Duration> {
        if self.renewals == Some(0) {
            self.reached = true;
            return None;
        }
        let ttl = match self.until {
            Some(until) => {
                let left = until.saturating_duration_since(lock.key.clock().now());
                ttl.min(left + super::hold::MAX_HOLD_GRACE)
            }
            None => ttl,
        };
        Some(ttl)
    }

    /// A renewal went through.
    fn renewed(&mut self) {
        self.renewals = self.renewals.map(|n| n.saturating_sub(1));
    }
}

/// Tells the holder of generation `generation`, if it still holds, that it held as long as it
/// may: published, not recorded as a loss (the lock is still held; its holder releases it).
fn held_too_long(lock: &Lock, generation: u64, lost: &watch::Sender<Option<LockLost>>) {
    let believed = lock.holder().believed();
    if believed.generation != generation || !matches!(believed.hold, Hold::Held { .. }) {
        return;
    }
    tracing::warn!(target: TARGET, resource = lock.resource(), store = %lock.store,
        "the lock was held for its maximum hold: its holder is told to give it up");
    let _ = lost.send(Some(LockLost::new(
        lock.resource(),
        LostReason::HeldTooLong,
    )));
}

/// Does the monitor's timed duty; the next timer, if any. A refresh error that ends the lease
/// goes to `cause`.
async fn on_timer(
    lock: &Lock,
    duty: Duty,
    generation: u64,
    cause: &mut Option<Error>,
    limits: &mut Limits,
) -> Option<Duration> {
    match duty {
        Duty::Renew { ttl } => match lock.refresh(Some(limits.renewal(lock, ttl)?)).await {
            // A loss (or a release meanwhile) is in the holder's state now.
            Ok(()) => {
                limits.renewed();
                Some(renew_period(lock, ttl))
            }
            Err(err) if err.is_lost() || err.is_conflict() || err.is_expired() => None,
            Err(err) => match lock.remaining_lifetime() {
                // It may pass: try again sooner, while the lease lasts.
                Some(left) if !left.is_zero() => {
                    tracing::warn!(target: TARGET, resource = lock.resource(), store = %lock.store, error = %err,
                        "could not refresh the lock; retrying while it lasts");
                    Some(
                        (renew_period(lock, ttl) / 4)
                            .max(Duration::from_millis(10))
                            .min(left),
                    )
                }
                _ => {
                    tracing::warn!(target: TARGET, resource = lock.resource(), store = %lock.store, error = %err,
                        "could not refresh the lock before its lifetime ran out");
                    if lock.lose(generation, LostReason::Unreachable).await {
                        *cause = Some(err);
                    }
                    None
                }
            },
        },
        Duty::Expire => match lock.key.confirmed_lifetime() {
            Some(left) if !left.is_zero() => Some(left),
            _ => {
                lock.lose(generation, LostReason::Expired).await;
                None
            }
        },
        Duty::Check => {
            if let Err(err) = lock.is_acquired().await {
                tracing::debug!(target: TARGET, resource = lock.resource(), store = %lock.store, error = %err,
                    "could not check on the lock");
            }
            Some(CHECK_EVERY)
        }
        Duty::Watch => None,
    }
}
