//! Acquiring: the retry loop for stores without a native wait (each attempt a call on the
//! holder's executor, see `calls.rs`), and the native wait.

use std::time::Duration;

use rand::Rng as _;

use super::Lock;
use super::calls::{Reconcile, Recorded};
use super::lockable::Wait;
use crate::error::{Error, ErrorKind, Result};
use crate::key::Mode;
use crate::logging::TARGET;
use crate::mutex::lock;
use crate::serial::Start;
use crate::store::{Capabilities, Watcher};

impl Lock {
    pub(super) async fn acquire_mode(&self, asked: Mode, wait: Wait) -> Result<bool> {
        let timer = crate::telemetry::AcquireTimer::start(
            self.store.as_ref(),
            asked,
            self.key.permits().is_some(),
        );
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
        if self.key.permits().is_some() {
            super::counting(self.store.as_ref(), &self.key)?;
            if asked == Mode::Read {
                return Err(Error::invalid_argument(
                    "a semaphore's permits are taken whole: there is no shared mode",
                )
                .with_resource(self.resource()));
            }
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
                    got = self.ride_out(mode, caps, &last_error) => got,
                    () = timeout => {
                        tracing::info!(target: TARGET, resource = self.resource(), store = %self.store, wait = ?d,
                            "gave up waiting for the lock");
                        Ok(false)
                    }
                };
                let last = lock(&last_error).take();
                match (got, last) {
                    // Already said as a failed acquisition (a store's own wait).
                    (Ok(false), Some(err)) if err.kind() == ErrorKind::Acquiring => Err(err),
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

    /// Waits, trying again after a temporary error until the caller's deadline drops this
    /// future: the retry loop rides out its attempts' errors itself; a store's own wait that
    /// fails for a temporary reason (a paused or restarting server) is started again after a
    /// growing pause, its error kept in `last_error`.
    async fn ride_out(
        &self,
        mode: Mode,
        caps: Capabilities,
        last_error: &std::sync::Mutex<Option<Error>>,
    ) -> Result<bool> {
        let mut pause = Duration::from_millis(50);
        loop {
            match self
                .acquire_or_wait(mode, true, caps, Some(last_error))
                .await
            {
                Err(err) if err.is_temporary() && !err.is_expired() => {
                    tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, error = %err,
                        retry_in = ?pause, "a temporary error while waiting; waiting again");
                    *lock(last_error) = Some(err);
                    self.key.clock().sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                other => return other,
            }
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
        let native = blocking
            && match mode {
                Mode::Write => caps.blocking,
                Mode::Read => caps.blocking_shared,
            };
        let outcome = if native {
            // A key that can have travelled from another process may hold what this process
            // does not know of: one plain attempt first tells it, before a wait.
            if caps.serializable_keys && self.holder().mode().is_none() {
                match self.attempt(mode).await {
                    Ok(None) => Ok(true),
                    Ok(Some(_)) => {
                        crate::telemetry::contended(self.store.as_ref());
                        crate::telemetry::waited(self.store.as_ref());
                        self.native_wait(mode).await
                    }
                    Err(err) => Err(err),
                }
            } else {
                self.native_wait(mode).await
            }
        } else {
            self.retry_loop(mode, blocking, caps, ride_out).await
        };
        match outcome {
            Ok(true) => {
                self.acquired_log(mode);
                Ok(true)
            }
            Ok(false) => {
                tracing::info!(target: TARGET, resource = self.resource(), store = %self.store,
                    "failed to acquire the lock, someone else holds it");
                Ok(false)
            }
            // The store already took it back.
            Err(err) if err.is_expired() => Err(err),
            Err(err) if err.is_conflict() => {
                // A native wait that cannot go on: nothing was stored, and the holder's state
                // says what it still holds.
                tracing::info!(target: TARGET, resource = self.resource(), store = %self.store,
                    "failed to acquire the lock, someone else holds it");
                Err(err)
            }
            // Bad input (a resource name the store cannot hold): said as it is, nothing stored.
            Err(err) if err.kind() == ErrorKind::InvalidArgument => Err(err),
            Err(err) => {
                // Whatever the failed save may have stored is taken back by its call, after it
                // lands and before this holder's next store call.
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

    async fn retry_loop(
        &self,
        mode: Mode,
        blocking: bool,
        caps: Capabilities,
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
                watcher = self
                    .store
                    .watch(&self.key, self.holder().wait_began())
                    .await?;
            }
            let conflict = match (self.attempt(mode).await, ride_out) {
                (Ok(None), _) => return Ok(true),
                (Ok(Some(conflict)), _) => conflict,
                (Err(err), Some(slot)) if err.is_temporary() && !err.is_expired() => {
                    tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, error = %err,
                        retry_in = ?pause, "a temporary error while waiting; trying again");
                    *lock(slot) = Some(err);
                    self.key.clock().sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                }
                (Err(err), _) => return Err(err),
            };
            if let Some(slot) = ride_out {
                // The store answered: an earlier error is no longer what stands in the way.
                lock(slot).take();
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
            self.between_attempts(watcher.as_mut(), conflict.retry_after)
                .await;
        }
    }

    /// The pause of a waiting attempt: until the watcher fires, or the holders' lifetimes end
    /// if the store said when, or a poll (unless the watcher sees every release).
    async fn between_attempts(&self, watcher: Option<&mut Watcher>, retry_after: Option<Duration>) {
        // However quickly a watcher fires, let the scheduler (and a caller's deadline) run
        // between attempts: a wait must never spin without yielding.
        tokio::task::yield_now().await;
        tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, "waiting for the lock");
        let poll = match &watcher {
            Some(w) if w.sees_every_release() => None,
            _ => Some(Duration::from_millis(rand::rng().random_range(90..=110))),
        };
        let sleep = match (retry_after, poll) {
            (Some(hint), Some(poll)) => Some(hint.min(poll)),
            (hint, poll) => hint.or(poll),
        };
        match (watcher, sleep) {
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

    /// The store's own wait. It only returns a refusal when it cannot go on (the holder lost
    /// the read lock it was promoting): a wait that does not give up by itself reports that as
    /// a conflict error, never as "not acquired".
    ///
    /// Native waits do not run on the holder's executor: a pending wait never blocks a release,
    /// check or refresh of the same holder. Its answer is taken in by a call (`record_wait`);
    /// dropped, it leaves a reconcile behind, which takes back a grant nobody received.
    async fn native_wait(&self, mode: Mode) -> Result<bool> {
        loop {
            // The holder's calls made before go first (a clean-up reaching the store after
            // the wait's grant would take it back): one empty call waits for them, and reads
            // how many calls have started while it holds the turn (read after it, a sibling's
            // call could already have started and be missed by the quiet check).
            let began = self
                .call(Start::IfAwaited, |lock, _| async move {
                    lock.holder().serial().started()
                })
                .await;
            self.key.reset_lifetime();
            let reconcile = Reconcile::armed(self);
            let saved = match mode {
                Mode::Write => self.store.wait_and_save(&self.key, self.save_ttl()).await,
                Mode::Read => {
                    self.store
                        .wait_and_save_read(&self.key, self.save_ttl())
                        .await
                }
            };
            reconcile.disarm();
            let recorded = self
                .call(Start::Always, move |lock, call| async move {
                    lock.record_wait(mode, saved, began, &call).await
                })
                .await?;
            match recorded {
                Recorded::Granted => return Ok(true),
                Recorded::Again => continue,
                Recorded::Refused => {
                    return Err(Error::conflict(self.resource())
                        .with_reason("the wait could not go on: the lock held before was lost")
                        .with_store(&self.store));
                }
            }
        }
    }

    fn acquired_log(&self, mode: Mode) {
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
    }
}
