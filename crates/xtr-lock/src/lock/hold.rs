//! How long a holder keeps its lock: a minimum hold (its release leaves the lock to run out on
//! the store's clock, or waits it out) and a maximum hold (no renewal past it; the holder is
//! told [`LostReason::HeldTooLong`](crate::LostReason::HeldTooLong)).

use std::time::Duration;

use super::Lock;
use crate::error::Result;
use crate::holder::Hold;
use crate::logging::TARGET;
use crate::store::Holding;

/// The limits of one lock's holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HoldLimits {
    pub(crate) min: Option<Duration>,
    pub(crate) max: Option<Duration>,
    pub(crate) max_renewals: Option<u32>,
    /// Opted out of revocation: its monitor does not look for notices.
    pub(crate) ignores_revocation: bool,
}

/// How far past its maximum hold the stored lock may last: the time its holder has to stop
/// its work and release (`xtr-lock run`'s default `--kill-after` is 10 s) before the lock
/// expires by itself. A holder that hangs holds no longer than the maximum and this.
pub const MAX_HOLD_GRACE: Duration = Duration::from_secs(15);

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
    /// The release runs in the holder's call like every release: dropping its future (or the
    /// guard) does not cut the hold short, and the lock is let go when it ends;
    /// [`cut_min_hold`](Lock::cut_min_hold) ends a hold being waited out at once.
    #[must_use]
    pub fn with_min_hold(mut self, min: Duration) -> Self {
        self.hold.min = Some(min).filter(|d| !d.is_zero());
        self
    }

    /// The same lock, held at most `max` from each acquisition by its guards, scopes and
    /// [`keep_alive`](crate::Lockable::keep_alive): where locks expire, neither the acquisition
    /// nor a renewal gives a lifetime past it and [`MAX_HOLD_GRACE`] (the time to stop the work
    /// and release, so that a holder that hangs holds no longer), and when it has passed the
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

    /// Whether guards, scopes and [`keep_alive`](crate::Lockable::keep_alive) look for a
    /// revocation ([`Lock::revoke`], `xtr-lock revoke`) and give the lock up when one comes
    /// (the default). Looking costs one read of the store per renewal (once a second where
    /// locks do not expire), or a watch where the store tells of changes; a lock that must not
    /// be taken away by others opts out.
    #[must_use]
    pub fn with_revocable(mut self, revocable: bool) -> Self {
        self.hold.ignores_revocation = !revocable;
        self
    }

    pub(crate) fn revocable(&self) -> bool {
        !self.hold.ignores_revocation
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

    /// The lifetime an acquisition asks for: the ttl, but not past the maximum hold and its
    /// grace.
    pub(super) fn save_ttl(&self) -> Option<Duration> {
        match (self.ttl, self.hold.max) {
            (Some(ttl), Some(max)) => Some(ttl.min(max + MAX_HOLD_GRACE)),
            (ttl, _) => ttl,
        }
    }

    /// How long the hold of `generation` has lasted, if its start is known.
    pub(crate) fn held_for(&self, generation: u64) -> Option<Duration> {
        let since = self.holder().since(generation)?;
        Some(self.key.clock().now().saturating_duration_since(since))
    }

    /// Ends the minimum hold of this holder's release that is holding on (on a store whose
    /// locks die with their holder): it lets go at once. For a process told to stop
    /// (`xtr-lock run` on SIGINT or SIGTERM) while its release waits out the minimum.
    pub fn cut_min_hold(&self) {
        self.holder().cut_min_hold();
    }

    /// What is left of the minimum hold of the lock held now; `None` when nothing is left (or
    /// no minimum, or nothing held).
    fn min_hold_left(&self) -> Option<Duration> {
        let min = self.hold.min?;
        let believed = self.holder().believed();
        if !matches!(believed.hold, Hold::Held { .. }) || !self.excludes() {
            return None;
        }
        let held = self.held_for(believed.generation).unwrap_or_default();
        Some(min.saturating_sub(held)).filter(|left| !left.is_zero())
    }

    /// The store calls of a release, inside the holder's call (a release, once asked for,
    /// happens): within a minimum hold, left to run out on the store's clock, or held until
    /// the hold is over where the store cannot; then deleted. Whether a live lock was let go.
    pub(super) async fn let_go(&self) -> Result<bool> {
        if let Some(left) = self.min_hold_left() {
            // A release goes through even when nobody waits for it (a dropped guard's).
            let answer = crate::serial::attended(self.store.release_after(&self.key, left)).await;
            match answer {
                Ok(Some(holding)) => {
                    self.holder().released();
                    // The stored lock is left to run out: this holder must not find it again
                    // (a renewal or a check would take it back), so it is a new holder now.
                    self.key.forget_tokens();
                    tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, left = ?left,
                        "left the lock to run out at the end of its minimum hold");
                    return Ok(matches!(holding, Holding::Held(_)));
                }
                Ok(None) => {
                    tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, left = ?left,
                        "holding the lock until the end of its minimum hold");
                    let cut = self.holder().min_hold_cut();
                    tokio::select! {
                        () = self.key.clock().sleep(left) => {}
                        () = cut => {}
                    }
                }
                Err(err) => {
                    tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store, error = %err,
                        "could not leave the lock to run out at the end of its minimum hold: releasing it now");
                }
            }
        }
        let deleted = self.store.delete(&self.key).await;
        if deleted.is_ok() {
            self.holder().released();
        }
        deleted
    }
}
