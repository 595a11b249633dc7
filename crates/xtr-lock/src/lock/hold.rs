//! How long a holder keeps its lock: a minimum hold (its release leaves the lock to run out on
//! the store's clock, or waits it out) and a maximum hold (no renewal past it; the holder is
//! told [`LostReason::HeldTooLong`](crate::LostReason::HeldTooLong)).

use std::time::Duration;

use super::Lock;
use super::lockable::Release;
use crate::error::Result;
use crate::holder::Hold;
use crate::logging::TARGET;
use crate::serial::Start;
use crate::store::Holding;

/// The limits of one lock's holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HoldLimits {
    pub(crate) min: Option<Duration>,
    pub(crate) max: Option<Duration>,
    pub(crate) max_renewals: Option<u32>,
}

/// How far past its maximum hold a renewal still keeps the lock: the holder's release, right
/// after the maximum, finds it there instead of racing its expiry.
pub(crate) const MAX_HOLD_GRACE: Duration = Duration::from_secs(1);

impl Lock {
    /// The same lock, held at least `min` from each acquisition: a release sooner lets the lock
    /// run out when `min` has passed. Where locks expire on the store's own clock (Redis, the
    /// SQL table, Memcached, etcd, a quorum of those) the release shortens the stored lifetime
    /// to what is left and returns at once; where the lock dies with its holder (flock, SysV,
    /// advisory and `GET_LOCK` sessions, pub/sub) the release keeps holding until then.
    ///
    /// The pattern of scheduled jobs on several machines (ShedLock's `lockAtLeastFor`): a job
    /// of a few seconds holds its hourly lock for most of the hour, so that a machine whose
    /// clock is behind does not run it again. Zero turns it off.
    ///
    /// A release dropped while it waits leaves the lock held; a clone with
    /// `with_min_hold(Duration::ZERO)` releases at once (it is the same holder).
    #[must_use]
    pub fn with_min_hold(mut self, min: Duration) -> Self {
        self.hold.min = Some(min).filter(|d| !d.is_zero());
        self
    }

    /// The same lock, held at most `max` from each acquisition by its guards, scopes and
    /// [`keep_alive`](crate::Lockable::keep_alive): no renewal reaches past it (but for a
    /// second's grace, so that the release still finds the lock), and when it has passed the
    /// loss signal fires with [`LostReason::HeldTooLong`](crate::LostReason::HeldTooLong): a
    /// scope's body is stopped and the lock released, `xtr-lock run` stops its command and exits
    /// 4. A job that hangs does not hold its lock forever. Zero turns it off.
    #[must_use]
    pub fn with_max_hold(mut self, max: Duration) -> Self {
        self.hold.max = Some(max).filter(|d| !d.is_zero());
        self
    }

    /// The same lock, renewed at most `renewals` times per acquisition (pottery's
    /// `num_extensions`): when the next renewal would be due, the loss signal fires with
    /// [`LostReason::HeldTooLong`](crate::LostReason::HeldTooLong), as with
    /// [`with_max_hold`](Lock::with_max_hold). Only where locks expire and are renewed.
    #[must_use]
    pub fn with_max_renewals(mut self, renewals: u32) -> Self {
        self.hold.max_renewals = Some(renewals);
        self
    }

    /// The minimum hold, if one is set.
    pub fn min_hold(&self) -> Option<Duration> {
        self.hold.min
    }

    /// The maximum hold, if one is set.
    pub fn max_hold(&self) -> Option<Duration> {
        self.hold.max
    }

    pub(crate) fn max_renewals(&self) -> Option<u32> {
        self.hold.max_renewals
    }

    /// How long the hold of `generation` has lasted, if its start is known.
    pub(crate) fn held_for(&self, generation: u64) -> Option<Duration> {
        let since = self.holder().since(generation)?;
        Some(self.key.clock().now().saturating_duration_since(since))
    }

    /// What is left of the minimum hold of the lock held now; `None` when nothing is left (or
    /// no minimum, or nothing held).
    pub(super) fn min_hold_left(&self) -> Option<Duration> {
        let min = self.hold.min?;
        let believed = self.holder().believed();
        if !matches!(believed.hold, Hold::Held { .. }) || !self.excludes() {
            return None;
        }
        let held = self.held_for(believed.generation).unwrap_or_default();
        Some(min.saturating_sub(held)).filter(|left| !left.is_zero())
    }

    /// A release that leaves the lock to run out `left` from now on the store's clock; `None`
    /// when the store cannot (the caller holds on until then, then releases).
    pub(super) async fn release_after(&self, left: Duration) -> Option<Result<Release>> {
        let (answer, believed) = self
            .call(Start::Always, move |lock, _| async move {
                let believed = lock.holder().believed().hold;
                let answer = lock.store.release_after(&lock.key, left).await;
                if matches!(answer, Ok(Some(_))) {
                    lock.holder().released();
                }
                (answer, believed)
            })
            .await;
        let answer = match answer {
            Ok(None) => return None,
            Ok(Some(holding)) => Ok(matches!(holding, Holding::Held(_))),
            Err(err) => Err(err),
        };
        if answer.is_ok() {
            tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, left = ?left,
                "left the lock to run out at the end of its minimum hold");
        }
        Some(self.release_outcome(believed, answer))
    }
}
