//! Acquiring: one attempt under the holder's turn, the retry loop for stores without a native
//! wait, the native wait, and the guard that takes back what a dropped acquire stored.

use std::time::Duration;

use rand::Rng as _;

use super::Lock;
use crate::cleanup::schedule_cleanup;
use crate::error::{Error, ErrorKind, LostReason, Result};
use crate::key::Mode;
use crate::lockable::Wait;
use crate::logging::TARGET;
use crate::store::{Capabilities, Conflict, Saved, Watcher, check_expiry};

impl Lock {
    pub(super) async fn acquire_mode(&self, asked: Mode, wait: Wait) -> Result<bool> {
        let timer = crate::telemetry::AcquireTimer::start(self.store.as_ref(), asked);
        let got = self.acquire_timed(asked, wait).await;
        timer.finish(match (&got, wait) {
            (Ok(true), _) => "acquired",
            (Ok(false), Wait::AtMost(d)) if !d.is_zero() => "timeout",
            (Ok(false), _) => "conflict",
            (Err(e), _) if e.is_conflict() => "conflict",
            (Err(_), _) => "error",
        });
        got
    }

    async fn acquire_timed(&self, asked: Mode, wait: Wait) -> Result<bool> {
        if let Some(ttl) = self.ttl.filter(|t| *t > crate::limits::MAX_DURATION) {
            return Err(Error::invalid_ttl(ttl).with_resource(self.resource()));
        }
        if let Wait::AtMost(d) = wait
            && d > crate::limits::MAX_DURATION
        {
            return Err(Error::invalid_argument(format!(
                "a wait must be at most 3650 days, got {} seconds",
                d.as_secs()
            ))
            .with_resource(self.resource()));
        }
        let caps = self.store.capabilities();
        let mode = if asked == Mode::Read && !caps.shared {
            tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store,
                "store does not support read locks, falling back to a write lock");
            Mode::Write
        } else {
            asked
        };
        match wait {
            Wait::Never => self.acquire_or_wait(mode, false, caps, None).await,
            Wait::AtMost(d) if d.is_zero() => self.acquire_or_wait(mode, false, caps, None).await,
            Wait::AtMost(d) => {
                // A wait with a deadline rides out temporary errors (a server restarting, a
                // quorum short of members) until the deadline, then reports the last one.
                let last_error = std::sync::Mutex::new(None);
                let timeout = self.key.clock().sleep(d);
                let got = tokio::select! {
                    biased;
                    got = self.acquire_or_wait(mode, true, caps, Some(&last_error)) => got,
                    () = timeout => {
                        tracing::info!(target: TARGET, resource = self.resource(), store = %self.store, wait = ?d,
                            "gave up waiting for the lock");
                        Ok(false)
                    }
                };
                let last = last_error.lock().unwrap_or_else(|e| e.into_inner()).take();
                match (got, last) {
                    (Ok(false), Some(err)) => Err(Error::wrap(
                        ErrorKind::Acquiring,
                        self.resource(),
                        "failed to acquire the lock",
                        err,
                    )),
                    (got, _) => got,
                }
            }
            Wait::Forever => self.acquire_or_wait(mode, true, caps, None).await,
        }
    }

    /// With `ride_out`, temporary errors of attempts are retried (with a growing pause), the
    /// last one kept there, until the caller's deadline drops this future.
    async fn acquire_or_wait(
        &self,
        mode: Mode,
        blocking: bool,
        caps: Capabilities,
        ride_out: Option<&std::sync::Mutex<Option<Error>>>,
    ) -> Result<bool> {
        let mut guard = CancelGuard::new(self);
        let native = blocking
            && match mode {
                Mode::Write => caps.blocking,
                Mode::Read => caps.blocking_shared,
            };
        let outcome = if native {
            // A key that can have travelled from another process may hold what this process
            // does not know of: one plain attempt first tells it, before a wait whose drop must
            // not take back a read lock it held.
            if caps.serializable_keys && self.holder().mode().is_none() {
                match self.attempt(mode, &mut guard).await {
                    Ok(None) => Ok(true),
                    Ok(Some(_)) => {
                        crate::telemetry::contended(self.store.as_ref());
                        crate::telemetry::waited(self.store.as_ref());
                        self.native_wait(mode, &mut guard).await
                    }
                    Err(err) => Err(err),
                }
            } else {
                self.native_wait(mode, &mut guard).await
            }
        } else {
            self.retry_loop(mode, blocking, caps, &mut guard, ride_out)
                .await
        };
        match outcome {
            Ok(true) => {
                // The guard stays armed through the lifetime check: a drop there still takes
                // the new lock back.
                let settled = self.confirm_lifetime(mode).await;
                guard.disarm();
                if settled.is_err() {
                    self.forget_expired(&guard);
                }
                settled.map(|()| true)
            }
            Ok(false) => {
                guard.disarm();
                tracing::info!(target: TARGET, resource = self.resource(), store = %self.store,
                    "failed to acquire the lock, someone else holds it");
                Ok(false)
            }
            Err(err) if err.is_expired() => {
                // The store already took it back.
                guard.disarm();
                self.forget_expired(&guard);
                Err(err)
            }
            Err(err) if err.is_conflict() => {
                // A native wait that cannot go on: nothing was stored, and the holder's state
                // says what it still holds.
                guard.disarm();
                tracing::info!(target: TARGET, resource = self.resource(), store = %self.store,
                    "failed to acquire the lock, someone else holds it");
                Err(err)
            }
            Err(err) if err.kind() == ErrorKind::InvalidArgument => {
                // Bad input (a resource name the store cannot hold): said as it is, nothing
                // stored.
                guard.disarm();
                Err(err)
            }
            Err(err) => {
                // The guard stays armed: whatever the failed save may have stored is taken back
                // before this holder's next store operation.
                tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store, error = %err,
                    "failed to acquire the lock");
                Err(Error::wrap(
                    ErrorKind::Acquiring,
                    self.resource(),
                    "failed to acquire the lock",
                    err,
                ))
            }
        }
    }

    /// After an expiry: a fresh acquisition holds nothing; a holder that held before lost it.
    fn forget_expired(&self, guard: &CancelGuard<'_>) {
        if guard.fresh {
            self.holder().released();
        } else {
            self.holder().found_not_held(LostReason::Expired);
        }
    }

    /// One save attempt, under the holder's turn: `None` when granted, else the refusal.
    async fn attempt(&self, mode: Mode, guard: &mut CancelGuard<'_>) -> Result<Option<Conflict>> {
        let _turn = self.holder().turn().await;
        guard.at_attempt();
        // A waiter's lifetime starts with the attempt that wins, never earlier.
        let before = self.key.deadline();
        self.key.reset_lifetime();
        let saved = match mode {
            Mode::Write => self.store.save(&self.key, self.ttl).await,
            Mode::Read => self.store.save_read(&self.key, self.ttl).await,
        };
        if !matches!(saved, Ok(Saved::Acquired(_))) && !saved.as_ref().is_err_and(Error::is_expired)
        {
            // Not granted: a holder that held keeps the lease the store knows.
            self.key.restore_deadline(before);
        }
        self.take_outcome(mode, saved?, guard)
    }

    /// Records what a store's answer means for the holder.
    fn take_outcome(
        &self,
        mode: Mode,
        saved: Saved,
        guard: &mut CancelGuard<'_>,
    ) -> Result<Option<Conflict>> {
        match saved {
            Saved::Acquired(acquired) => {
                self.holder().acquired(mode, acquired.fencing_token);
                guard.at_acquisition();
                Ok(None)
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
                Ok(Some(conflict))
            }
        }
    }

    async fn retry_loop(
        &self,
        mode: Mode,
        blocking: bool,
        caps: Capabilities,
        guard: &mut CancelGuard<'_>,
        ride_out: Option<&std::sync::Mutex<Option<Error>>>,
    ) -> Result<bool> {
        let mut pause = Duration::from_millis(50);
        // The first attempt is `try_acquire`'s: a free lock costs a blocking acquire nothing
        // more. Only a refused waiter registers, and attempts again at once before it waits:
        // a release between the refusal and the registration is seen by that attempt, one
        // after it by the watcher.
        let mut waiting = false;
        // Kept until the next one is registered: a store that queues waiters keeps this
        // holder's place in the queue from one attempt to the next.
        let mut watcher: Option<Watcher> = None;
        loop {
            if waiting && caps.notifies {
                watcher = self.store.watch(&self.key).await?;
            }
            let conflict = match (self.attempt(mode, guard).await, ride_out) {
                (Ok(None), _) => return Ok(true),
                (Ok(Some(conflict)), _) => conflict,
                (Err(err), Some(slot)) if err.is_temporary() && !err.is_expired() => {
                    tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, error = %err,
                        retry_in = ?pause, "a temporary error while waiting; trying again");
                    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
                    self.key.clock().sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                }
                (Err(err), _) => return Err(err),
            };
            if let Some(slot) = ride_out {
                // The store answered: an earlier error is no longer what stands in the way.
                slot.lock().unwrap_or_else(|e| e.into_inner()).take();
                pause = Duration::from_millis(50);
            }
            if !waiting {
                // Counted once per call: its first refusal.
                crate::telemetry::contended(self.store.as_ref());
            }
            if !blocking {
                return Ok(false);
            }
            if !waiting {
                waiting = true;
                self.holder().begins_waiting();
                crate::telemetry::waited(self.store.as_ref());
                if caps.notifies {
                    continue;
                }
            }
            // However quickly a watcher fires, give the scheduler (and a caller's deadline) a
            // turn between attempts: a wait must never spin without yielding.
            tokio::task::yield_now().await;
            tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, "waiting for the lock");
            // Sleep until the holders' lifetimes end, if the store said when; poll unless the
            // watcher sees every release.
            let poll = match &watcher {
                Some(w) if w.sees_every_release() => None,
                _ => Some(Duration::from_millis(rand::rng().random_range(90..=110))),
            };
            let sleep = match (conflict.retry_after, poll) {
                (Some(hint), Some(poll)) => Some(hint.min(poll)),
                (hint, poll) => hint.or(poll),
            };
            match (watcher.as_mut(), sleep) {
                (Some(watcher), Some(d)) => {
                    tokio::select! {
                        () = watcher => {}
                        () = self.key.clock().sleep(d) => {}
                    }
                }
                (Some(watcher), None) => watcher.await,
                (None, Some(d)) => self.key.clock().sleep(d).await,
                (None, None) => unreachable!("without a watcher the lock always polls"),
            }
        }
    }

    /// The store's own wait. It only returns a refusal when it cannot go on (the holder lost
    /// the read lock it was promoting): a wait that does not give up by itself reports that as
    /// a conflict error, never as "not acquired".
    async fn native_wait(&self, mode: Mode, guard: &mut CancelGuard<'_>) -> Result<bool> {
        // Native waits are not run under the holder's turn: a pending wait must never block a
        // release or refresh of the same holder. Background clean-ups of this holder still go
        // first (taking the turn waits for them): one reaching the store after the wait's save
        // would take the new lock back.
        drop(self.holder().turn().await);
        guard.at_attempt();
        self.key.reset_lifetime();
        let saved = match mode {
            Mode::Write => self.store.wait_and_save(&self.key, self.ttl).await,
            Mode::Read => self.store.wait_and_save_read(&self.key, self.ttl).await,
        }?;
        match self.take_outcome(mode, saved, guard)? {
            None => Ok(true),
            Some(_) => Err(Error::conflict(self.resource())
                .with_reason("the wait could not go on: the lock held before was lost")
                .with_store(&self.store)),
        }
    }

    /// After a successful save: the lifetime check of the Lock (the store made its own).
    async fn confirm_lifetime(&self, mode: Mode) -> Result<()> {
        check_expiry(self.store.as_ref(), &self.key).await?;
        match mode {
            Mode::Write => {
                tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store,
                fencing_token = self.holder().fencing_token(), "acquired the lock")
            }
            Mode::Read => {
                tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store,
                "acquired the lock for reading")
            }
        }
        Ok(())
    }
}

/// Takes back what a dropped acquire may have stored.
///
/// Armed per attempt, under the holder's turn: only an attempt made while the holder held
/// nothing can store something that is not the holder's already. An attempt made while it held
/// (a re-acquire, a promotion, or a sibling task of the same holder that got the lock first)
/// must never be undone by a delete.
struct CancelGuard<'a> {
    lock: &'a Lock,
    /// Whether the attempt in flight (or the last one) began while the holder held nothing.
    fresh: bool,
    armed: bool,
    /// The holder's generation the clean-up may remove.
    generation: u64,
}

impl<'a> CancelGuard<'a> {
    fn new(lock: &'a Lock) -> Self {
        CancelGuard {
            lock,
            fresh: false,
            armed: false,
            generation: lock.holder().generation(),
        }
    }

    /// Called right before each store attempt (under the turn, for attempts that take it).
    fn at_attempt(&mut self) {
        self.fresh = self.lock.holder().mode().is_none();
        self.armed = self.fresh;
        self.generation = self.lock.holder().generation();
    }

    /// Called when an attempt was granted: a drop from here on removes the new acquisition.
    fn at_acquisition(&mut self) {
        self.generation = self.lock.holder().generation();
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            schedule_cleanup(
                self.lock.key.clone(),
                self.lock.store.clone(),
                self.generation,
                "cancelled or failed acquire",
            );
        }
    }
}
