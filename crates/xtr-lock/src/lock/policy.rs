//! What to do when the lock is held by someone else: the overlap policies of scheduled jobs.

use super::Lock;
use super::lockable::{Lockable as _, Wait};
use super::revoke::{QUEUE_SUFFIX, Sibling};
use crate::error::Result;
use crate::key::Mode;
use crate::logging::TARGET;

/// What to do when someone else holds the lock (`xtr-lock run --on-conflict`): the overlap
/// policies of schedulers (Kubernetes CronJobs' `Forbid`/`Replace`, Temporal's skip and buffer
/// one, `run-one` and `run-this-one`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnConflict {
    /// Give up at once (`-n`): at most one run at a time, the others skipped.
    Skip,
    /// Wait for the lock, as long as the wait allows (the default).
    #[default]
    Wait,
    /// Wait only if nobody else already waits this way, else give up: at most one run queued
    /// behind the current one. The queued run holds the resource's queue slot (a sibling lock,
    /// `"{resource}#xtr-queue"`) while it waits.
    QueueOne,
    /// Ask the current holders to give up ([`Lock::revoke`]), then take the lock when they let
    /// go, within the wait. Holders of other libraries cannot be asked: then it waits for them.
    Replace,
}

impl OnConflict {
    /// The policy's name on the command line: `skip`, `wait`, `queue-one`, `replace`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnConflict::Skip => "skip",
            OnConflict::Wait => "wait",
            OnConflict::QueueOne => "queue-one",
            OnConflict::Replace => "replace",
        }
    }
}

impl std::str::FromStr for OnConflict {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "skip" => OnConflict::Skip,
            "wait" => OnConflict::Wait,
            "queue-one" => OnConflict::QueueOne,
            "replace" => OnConflict::Replace,
            other => {
                return Err(crate::Error::invalid_argument(format!(
                    "unknown overlap policy {other:?}: expected skip, wait, queue-one or replace"
                )));
            }
        })
    }
}

impl Lock {
    /// Takes the lock in `mode` as `on_conflict` says when someone else holds it, waiting at
    /// most as `wait` allows (not at all for [`OnConflict::Skip`]). `Ok(false)`: not taken (held
    /// by someone else after the wait, skipped, or another run is already queued).
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](crate::Lockable::acquire_with); for `Replace`, a failure to post the
    /// revocation.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, it leaves nothing held (a queue slot or a notice
    /// taken is let go in the background, and so is the lock if it was taken meanwhile).
    pub async fn acquire_with_policy(
        &self,
        mode: Mode,
        wait: Wait,
        on_conflict: OnConflict,
    ) -> Result<bool> {
        if on_conflict == OnConflict::Wait {
            return self.acquire_with(mode, wait).await;
        }
        if self.acquire_with(mode, Wait::Never).await? {
            return Ok(true);
        }
        match on_conflict {
            OnConflict::Skip | OnConflict::Wait => Ok(false),
            OnConflict::QueueOne => self.queue_one(mode, wait).await,
            OnConflict::Replace => self.replace(mode, wait).await,
        }
    }

    /// Waits for the lock holding its queue slot, if nobody else does.
    async fn queue_one(&self, mode: Mode, wait: Wait) -> Result<bool> {
        let slot = self.sibling(QUEUE_SUFFIX);
        let Some(slot) = Sibling::take(slot, Mode::Write, Wait::Never).await? else {
            tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store,
                "another run is already queued: not queueing");
            return Ok(false);
        };
        let taken = self.acquire_with(mode, wait).await;
        self.then_let_go(slot, "the queue slot", taken).await
    }

    /// Posts a revocation notice, waits for the lock, takes the notice down; all within `wait`.
    async fn replace(&self, mode: Mode, wait: Wait) -> Result<bool> {
        tracing::info!(target: TARGET, resource = self.resource(), store = %self.store,
            "replacing the lock's holders: revoking it");
        let clock = self.key.clock().clone();
        let deadline = match wait {
            Wait::Never => Some(clock.now()),
            Wait::AtMost(d) => Some(clock.now() + d),
            Wait::Forever => None,
        };
        let left = || match deadline {
            Some(deadline) => Wait::AtMost(deadline.saturating_duration_since(clock.now())),
            None => Wait::Forever,
        };
        let notice = self.notice(left()).await?;
        let taken = self.acquire_with(mode, left()).await;
        match notice {
            Some(notice) => {
                self.then_let_go(notice, "the revocation notice", taken)
                    .await
            }
            None => taken,
        }
    }

    /// Lets `sibling` go after an acquisition ended as `taken`; a lock taken is released in
    /// the background if the caller leaves before the sibling is let go (nobody would know it
    /// holds).
    async fn then_let_go(&self, sibling: Sibling, what: &str, taken: Result<bool>) -> Result<bool> {
        let guard = TakeBack(taken.as_ref().is_ok_and(|t| *t).then(|| self.clone()));
        sibling.let_go(what).await;
        guard.disarm();
        taken
    }
}

/// Releases a lock in the background when dropped armed.
struct TakeBack(Option<Lock>);

impl TakeBack {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for TakeBack {
    fn drop(&mut self) {
        if let Some(lock) = self.0.take() {
            lock.release_in_background();
        }
    }
}
