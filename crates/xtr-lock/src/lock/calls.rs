//! The lock's store calls. Each runs on the holder's executor (`crate::serial`): one at a time
//! per holder, in order, to its end, and records what the store answered before the next one
//! starts. A call whose caller left takes back what it stored itself, before anything else of
//! the holder runs: a clean-up never meets a sibling's later grant.

use std::sync::Arc;

use super::Lock;
use crate::error::{Error, ErrorKind, LostReason, Result};
use crate::key::Mode;
use crate::logging::TARGET;
use crate::serial::{self, Call, Start};
use crate::store::{Conflict, Holding, Saved, check_expiry};

/// How a native wait's grant was taken in.
pub(super) enum Recorded {
    /// Granted, and recorded.
    Granted,
    /// Not granted after all (another call of the holder ran meanwhile and changed what it
    /// holds): wait again.
    Again,
    /// Refused: the wait could not go on.
    Refused,
}

impl Lock {
    /// Runs `body` on the holder's executor.
    pub(super) fn call<T, F, Fut>(&self, start: Start, body: F) -> serial::Running<T>
    where
        T: Send + 'static,
        F: FnOnce(Lock, Arc<Call>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let lock = self.clone();
        serial::run(self.holder().serial(), start, move |call| body(lock, call))
    }

    /// One save attempt: `None` when granted (recorded, its lifetime checked), else the refusal.
    pub(super) async fn attempt(&self, mode: Mode) -> Result<Option<Conflict>> {
        self.call(Start::IfAwaited, move |lock, call| async move {
            lock.attempt_now(mode, &call).await
        })
        .await
    }

    /// The attempt, inside its call.
    pub(super) async fn attempt_now(&self, mode: Mode, call: &Call) -> Result<Option<Conflict>> {
        let fresh = self.holder().mode().is_none();
        // A waiter's lifetime starts with the attempt that wins, never earlier.
        let before = self.key.deadline();
        self.key.reset_lifetime();
        let saved = match mode {
            Mode::Write => self.store.save(&self.key, self.save_ttl()).await,
            Mode::Read => self.store.save_read(&self.key, self.save_ttl()).await,
        };
        if !matches!(saved, Ok(Saved::Acquired(_))) && !saved.as_ref().is_err_and(Error::is_expired)
        {
            // Not granted: a holder that held keeps the lease the store knows.
            self.key.restore_deadline(before);
        }
        let saved = match saved {
            Ok(saved) => saved,
            Err(err) => return Err(self.failed(err, fresh)),
        };
        self.take_in(mode, saved, fresh, call).await
    }

    /// Records a store's answer to a save, checks a grant's lifetime, and takes a fresh grant
    /// back when the caller has left.
    async fn take_in(
        &self,
        mode: Mode,
        saved: Saved,
        fresh: bool,
        call: &Call,
    ) -> Result<Option<Conflict>> {
        if let Some(conflict) = self.take_outcome(mode, saved) {
            return Ok(Some(conflict));
        }
        if let Err(err) = check_expiry(self.store.as_ref(), &self.key).await {
            self.forget_expired(fresh);
            return Err(err);
        }
        if call.left() && fresh {
            self.take_back("its caller left before the grant arrived")
                .await;
        }
        Ok(None)
    }

    /// A save that failed: one that may have landed anyway (a timeout, a broken connection)
    /// is taken back after it, unless the holder already held (then what landed is its own).
    fn failed(&self, err: Error, fresh: bool) -> Error {
        if err.is_expired() {
            self.forget_expired(fresh);
        } else if fresh && !err.is_conflict() && err.kind() != ErrorKind::InvalidArgument {
            let lock = self.clone();
            serial::finish_later(async move {
                lock.take_back("the save failed, and may still land").await;
            });
        }
        err
    }

    /// After an expiry: a fresh acquisition holds nothing; a holder that held before lost it.
    pub(super) fn forget_expired(&self, fresh: bool) {
        if fresh {
            self.holder().released();
        } else {
            self.holder().found_not_held(LostReason::Expired);
        }
    }

    /// Deletes what the holder holds, inside a call, and forgets it.
    async fn take_back(&self, why: &'static str) {
        match self.store.delete(&self.key).await {
            Ok(_) => {
                tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store,
                why, "took the lock back")
            }
            Err(err) => {
                tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store,
                why, error = %err, "failed to take the lock back; it stays stored until it expires")
            }
        }
        self.holder().released();
    }

    /// Records what a store's answer to a save means for the holder; the refusal, if any.
    pub(super) fn take_outcome(&self, mode: Mode, saved: Saved) -> Option<Conflict> {
        match saved {
            Saved::Acquired(acquired) => {
                self.holder().acquired(mode, acquired.fencing_token);
                self.holder().mark_since(self.key.clock().now());
                None
            }
            Saved::Conflict(conflict) => {
                match (self.holder().mode(), conflict.kept) {
                    // A refused promotion keeps the read lock; a key that travelled learns that
                    // it reads.
                    (_, Some(kept)) => self.holder().found_held(kept),
                    (Some(was), None) => {
                        tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store, was = ?was,
                            "the lock was lost while trying to take it again or change its mode");
                        self.holder().found_not_held(LostReason::TakenOver);
                    }
                    (None, None) => {}
                }
                Some(conflict)
            }
        }
    }

    /// Takes in the answer of a native wait that began when `began` calls of the holder had
    /// started. A grant is believed as it is only if no other call of the holder ran meanwhile;
    /// otherwise (a sibling released, or a clean-up ran) a plain attempt confirms it.
    pub(super) async fn record_wait(
        &self,
        mode: Mode,
        saved: Result<Saved>,
        began: u64,
        call: &Call,
    ) -> Result<Recorded> {
        // This call is the one started since the wait began, or others were too.
        let quiet = self.holder().serial().started() == began + 1;
        let fresh = self.holder().mode().is_none();
        let saved = match saved {
            Ok(saved) => saved,
            Err(err) => {
                if !err.is_expired() && err.kind() != ErrorKind::InvalidArgument {
                    self.reconcile().await;
                }
                return Err(self.failed_wait(err, fresh));
            }
        };
        let conflict = if quiet {
            self.take_in(mode, saved, fresh, call).await?
        } else {
            if matches!(saved, Saved::Conflict(_)) {
                // Refused while what the holder holds changed: judged again by a new wait.
                return Ok(Recorded::Again);
            }
            match self.attempt_now(mode, call).await? {
                None => None,
                Some(_) => return Ok(Recorded::Again),
            }
        };
        Ok(match conflict {
            None => Recorded::Granted,
            Some(_) => Recorded::Refused,
        })
    }

    fn failed_wait(&self, err: Error, fresh: bool) -> Error {
        if err.is_expired() {
            self.forget_expired(fresh);
        }
        err
    }

    /// Makes what the holder believes agree with what the store says it holds: after a native
    /// wait that was dropped or failed, which may have been granted with nobody to receive it.
    /// A grant the holder does not believe in is taken back; a mode it did not know of is
    /// taken in; a hold the store no longer has is a loss.
    pub(super) async fn reconcile(&self) {
        match self.store.exists(&self.key).await {
            Ok(Holding::Held(mode)) => match self.holder().mode() {
                None => {
                    self.take_back("a wait was granted with nobody to receive it")
                        .await;
                }
                Some(believed) if believed != mode => self.holder().found_held(mode),
                Some(_) => {}
            },
            Ok(Holding::NotHeld(reason)) => {
                if self.excludes() && self.holder().found_not_held(reason) {
                    tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store,
                        reason = %reason, "the lock was lost");
                }
            }
            Err(err) => {
                tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store, error = %err,
                    "cannot tell whether an abandoned wait was granted; taking the lock back if the holder holds nothing");
                if self.holder().mode().is_none()
                    && let Err(err) = self.store.delete(&self.key).await
                {
                    tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store, error = %err,
                        "failed to take the lock back; it stays stored until it expires");
                }
            }
        }
    }

    /// Records the loss of generation `generation` in a call of the holder (after its calls in
    /// flight); whether it was news.
    pub(super) async fn lose(&self, generation: u64, reason: LostReason) -> bool {
        self.call(Start::IfAwaited, move |lock, _| async move {
            lock.holder().lose(generation, reason)
        })
        .await
    }

    /// Releases in the background (a dropped guard): the release is queued now, behind the
    /// holder's calls already made, and runs to its end.
    pub(super) fn release_later(&self) {
        drop(self.call(Start::Always, |lock, _| async move {
            if let Err(err) = lock.let_go().await {
                tracing::warn!(target: TARGET, resource = lock.resource(), store = %lock.store,
                    error = %err, "failed to release the lock of a dropped guard; it stays stored until it expires");
            }
        }));
    }
}

/// Queues a reconcile when dropped armed: what a dropped native wait leaves behind.
pub(super) struct Reconcile(Option<Lock>);

impl Reconcile {
    pub(super) fn armed(lock: &Lock) -> Self {
        Reconcile(Some(lock.clone()))
    }

    pub(super) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Reconcile {
    fn drop(&mut self) {
        if let Some(lock) = self.0.take() {
            drop(lock.call(Start::Always, |lock, _| async move {
                lock.reconcile().await;
            }));
        }
    }
}
