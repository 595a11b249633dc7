//! What to do when the lock is held by someone else: the overlap policies of scheduled jobs.

use std::time::Duration;

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
            OnConflict::Replace => {
                let bound = match wait {
                    Wait::Never => Duration::ZERO,
                    Wait::AtMost(d) => d,
                    Wait::Forever => crate::limits::MAX_DURATION,
                };
                tracing::info!(target: TARGET, resource = self.resource(), store = %self.store,
                    "replacing the lock's holders: revoking it");
                self.with_notice(bound, self.acquire_with(mode, wait)).await
            }
        }
    }

    /// Waits for the lock holding its queue slot, if nobody else does.
    async fn queue_one(&self, mode: Mode, wait: Wait) -> Result<bool> {
        let slot = self.sibling(QUEUE_SUFFIX);
        if !slot.acquire_with(Mode::Write, Wait::Never).await? {
            tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store,
                "another run is already queued: not queueing");
            return Ok(false);
        }
        let slot = Sibling::hold(slot)?;
        let taken = self.acquire_with(mode, wait).await;
        slot.let_go("the queue slot").await;
        taken
    }
}
