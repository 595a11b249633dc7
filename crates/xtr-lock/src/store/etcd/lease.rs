//! A holder's lease and the task that keeps it alive.
//!
//! A lease is granted when a holder that has none queues a key, kept alive (a keep-alive every
//! third of its ttl, or the DSN's `keepalive`) while the holder holds or waits, and revoked
//! once it holds nothing: that deletes every key on it at once, so a queue key whose own
//! delete was lost goes with it. A revoke is tried again until the cluster answers; `close`
//! waits for the revokes still under way (see [`Core::revoke`]).
//!
//! The keeper tells three states apart. **Alive**: a keep-alive was answered, and the lease
//! certainly lasts until that keep-alive's send time plus the ttl it answered (its *confirmed
//! end*, kept on the boot clock, which counts suspend). **Unconfirmed**: the confirmed end
//! passed with no answer since (the cluster unreachable, paused, or without a quorum); the
//! lease may have expired there, so a holder has lost its lock, but the keeper goes on trying,
//! and a waiter keeps its place if the lease turns out alive. **Gone**: etcd said the lease
//! is gone (a keep-alive answered with a ttl of 0: expired or revoked).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::{mpsc, oneshot, watch};

use super::clock::BootInstant;
use super::conn::Core;
use super::members::Member;
use crate::error::{Error, LostReason, Result};
use crate::mutex::lock;

/// Whether the lease lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Alive,
    /// Its confirmed end passed with no keep-alive answered since; the keeper still tries.
    Unconfirmed,
    Gone(LostReason),
}

/// Until when a lease certainly lasts, on the boot clock.
pub(super) type Confirmed = Arc<std::sync::Mutex<BootInstant>>;

/// A granted lease and its keeper.
pub(super) struct Lease {
    pub(super) id: i64,
    /// Until when the server has certainly kept the lease: the send time of the last answered
    /// keep-alive (or of the grant) plus the granted ttl.
    pub(super) confirmed: Confirmed,
    /// The ttl asked for (whole seconds); the server may have granted more.
    pub(super) asked: Duration,
    /// The ttl granted.
    ttl: Duration,
    pub(super) state: watch::Receiver<State>,
    refresh: mpsc::UnboundedSender<oneshot::Sender<Result<Duration>>>,
    task: tokio::task::AbortHandle,
}

impl Lease {
    /// Grants a lease of `ttl` and starts keeping it alive.
    pub(super) async fn grant(core: &Arc<Core>, ttl: Duration) -> Result<Lease> {
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let sent = BootInstant::now();
        let granted = core
            .call("lease grant", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        let id = granted.id();
        let granted_ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(1).max(1));
        let period = core
            .config
            .keepalive
            .unwrap_or(granted_ttl / 3)
            .min(granted_ttl / 2)
            .max(Duration::from_millis(100));
        let confirmed = Arc::new(std::sync::Mutex::new(sent.after(granted_ttl)));
        let (state_tx, state) = watch::channel(State::Alive);
        let (refresh, requests) = mpsc::unbounded_channel();
        let keeper = Keeper {
            core: core.clone(),
            id,
            ttl: granted_ttl,
            period,
            stream: None,
            confirmed: confirmed.clone(),
            state: state_tx,
            requests,
        };
        let task = tokio::spawn(keeper.run()).abort_handle();
        Ok(Lease {
            id,
            confirmed,
            asked: ttl,
            ttl: granted_ttl,
            state,
            refresh,
            task,
        })
    }

    /// Whether the lease is confirmed now: the keeper says so, and its confirmed end has not
    /// passed (the keeper's own timer may not have run yet).
    pub(super) fn alive(&self) -> bool {
        *self.state.borrow() == State::Alive && BootInstant::now() < *lock(&self.confirmed)
    }

    /// Whether etcd said the lease is gone.
    pub(super) fn gone(&self) -> bool {
        matches!(*self.state.borrow(), State::Gone(_))
    }

    /// One keep-alive now; answers the lease's remaining ttl.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the keep-alive goes out all the same.
    pub(super) async fn refresh(&self) -> Result<Duration> {
        let (reply, answer) = oneshot::channel();
        if self.refresh.send(reply).is_err() {
            return Err(Error::lost("", LostReason::Expired));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(Error::storage("the lease's keeper stopped")))
    }

    /// Stops keeping it alive and revokes it (its keys go with it), unless etcd already said it
    /// is gone. The revoke runs on its own task, tried again until it lands; see
    /// [`Core::revoke`].
    pub(super) fn revoke(self, core: &Arc<Core>) {
        self.task.abort();
        if !self.gone() {
            core.revoke(self.id, self.ttl);
        }
    }

    /// As [`revoke`](Lease::revoke), with its first try awaited: the lease's keys are gone when
    /// this returns, unless the cluster did not answer (the revoke then goes on in the
    /// background).
    pub(super) async fn revoke_now(self, core: &Arc<Core>) {
        self.task.abort();
        if !self.gone() {
            core.revoke_now(self.id, self.ttl).await;
        }
    }
}

/// Completes when the lease's keeper says it is gone, or (unless `only_gone`) that it is not
/// confirmed any more (never without a lease).
pub(super) async fn lease_gone(state: Option<watch::Receiver<State>>, only_gone: bool) {
    let Some(mut state) = state else {
        return std::future::pending().await;
    };
    loop {
        match *state.borrow_and_update() {
            State::Alive => {}
            State::Unconfirmed if only_gone => {}
            _ => return,
        }
        if state.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Keeper {
    core: Arc<Core>,
    id: i64,
    ttl: Duration,
    period: Duration,
    /// The keep-alive stream, and the member it goes to.
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream, Member)>,
    /// The send time of the last answered keep-alive (or of the grant) plus the ttl it
    /// answered: until then the lease certainly lasts.
    confirmed: Confirmed,
    state: watch::Sender<State>,
    requests: mpsc::UnboundedReceiver<oneshot::Sender<Result<Duration>>>,
}

/// The longest the keeper sleeps at a time: tokio's timers stop while the machine is
/// suspended, the boot clock does not, and a lease that ended in the meantime is seen this
/// soon after waking.
const NAP: Duration = Duration::from_secs(1);

impl Keeper {
    async fn run(mut self) {
        let mut waiting: Vec<oneshot::Sender<Result<Duration>>> = Vec::new();
        let mut next = BootInstant::now().after(self.period);
        loop {
            if !self.until_due(&mut waiting, next).await {
                return;
            }
            while let Ok(reply) = self.requests.try_recv() {
                waiting.push(reply);
            }
            let (sent, attempt) = self.lease_keepalive().await;
            match self.take_answer(sent, attempt, &mut waiting) {
                Some(then) => next = then,
                None => return,
            }
        }
    }

    /// Until a lease keep-alive is due (at `next`) or asked for (the requests go to
    /// `waiting`), watching the confirmed end. `false` when nobody can ask any more.
    async fn until_due(
        &mut self,
        waiting: &mut Vec<oneshot::Sender<Result<Duration>>>,
        next: BootInstant,
    ) -> bool {
        loop {
            let now = BootInstant::now();
            let end = self.confirmed();
            if now >= end {
                self.unconfirmed();
            }
            if !waiting.is_empty() || now >= next {
                return true;
            }
            let mut nap = next.since(now).min(NAP);
            if now < end {
                nap = nap.min(end.since(now));
            }
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                request = self.requests.recv() => match request {
                    Some(reply) => waiting.push(reply),
                    None => return false,
                },
            }
        }
    }

    /// One lease keep-alive, and when it was sent. While the lease is confirmed, an answer
    /// later than its confirmed end is too late for a holder: the attempt is cut there (and
    /// goes on afterwards).
    async fn lease_keepalive(&mut self) -> (BootInstant, Result<Option<Duration>>) {
        let sent = BootInstant::now();
        let end = self.confirmed();
        let attempt = if sent < end {
            tokio::time::timeout(end.since(sent), self.once())
                .await
                .unwrap_or_else(|_| {
                    Err(
                        Error::storage("no keep-alive answered by the lease's confirmed end")
                            .temporary(),
                    )
                })
        } else {
            self.once().await
        };
        (sent, attempt)
    }

    /// Takes in the answer to a lease keep-alive sent at `sent`, and answers those `waiting`
    /// for it: when the next one is due, `None` once the lease is gone.
    fn take_answer(
        &mut self,
        sent: BootInstant,
        attempt: Result<Option<Duration>>,
        waiting: &mut Vec<oneshot::Sender<Result<Duration>>>,
    ) -> Option<BootInstant> {
        match attempt {
            Ok(Some(left)) => {
                *lock(&self.confirmed) = sent.after(left);
                self.state.send_if_modified(|s| {
                    let was = *s;
                    *s = State::Alive;
                    was != State::Alive
                });
                let next = BootInstant::now().after(self.period);
                for reply in waiting.drain(..) {
                    let _ = reply.send(Ok(left));
                }
                Some(next)
            }
            Ok(None) => {
                tracing::warn!(target: crate::logging::TARGET, store = %self.core.shown,
                    lease = %format!("{:x}", self.id), "the lease expired or was revoked");
                self.state.send_replace(State::Gone(LostReason::Expired));
                for reply in waiting.drain(..) {
                    let gone = Error::storage("the lease is gone (expired or revoked)");
                    let _ = reply.send(Err(self.core.fail(gone)));
                }
                None
            }
            Err(e) => {
                // The stream goes; its member is left aside (when it may be the member's
                // fault) and the next stream opens on another.
                if let Some((_, _, member)) = self.stream.take()
                    && e.is_temporary()
                {
                    member.leave_aside();
                }
                if BootInstant::now() >= self.confirmed() {
                    self.unconfirmed();
                }
                tracing::debug!(target: crate::logging::TARGET, store = %self.core.shown,
                    error = %e, "a keep-alive failed; trying again");
                for reply in waiting.drain(..) {
                    let again = Error::storage(e.reason().unwrap_or("a keep-alive failed"));
                    let _ = reply.send(Err(self.core.fail(again.temporary())));
                }
                // Again soon (within what is left of the lease, if anything is).
                let pause =
                    (self.period / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
                Some(BootInstant::now().after(pause))
            }
        }
    }

    /// Until when the lease certainly lasts.
    fn confirmed(&self) -> BootInstant {
        *lock(&self.confirmed)
    }

    /// The confirmed end passed with no answer since: said once.
    fn unconfirmed(&self) {
        let changed = self.state.send_if_modified(|s| {
            let was = *s;
            if was == State::Alive {
                *s = State::Unconfirmed;
            }
            was == State::Alive
        });
        if changed {
            tracing::warn!(target: crate::logging::TARGET, store = %self.core.shown,
                lease = %format!("{:x}", self.id),
                "no keep-alive answered before the lease's confirmed end");
        }
    }

    /// One keep-alive: the remaining ttl, `None` when the lease is gone.
    async fn once(&mut self) -> Result<Option<Duration>> {
        let timeout = self.core.config.request_timeout;
        let answer = tokio::time::timeout(timeout, async {
            if self.stream.is_none() {
                let member = self.core.member().await?;
                let id = self.id;
                let mut lease = member.client.lease_client();
                match lease.keep_alive(id).await {
                    Ok((keeper, stream)) => self.stream = Some((keeper, stream, member)),
                    Err(etcd_client::Error::LeaseKeepAliveError(_)) => return Ok(None),
                    Err(e) => return Err(member.failed(failure(e))),
                }
                // Opening the stream sent a keep-alive, and its answer was a live lease.
                return Ok(Some(self.ttl));
            }
            let (keeper, stream, _) = self.stream.as_mut().expect("a stream");
            keeper.keep_alive().await.map_err(failure)?;
            match stream.message().await {
                Ok(Some(answer)) if answer.ttl() > 0 => Ok(Some(Duration::from_secs(
                    u64::try_from(answer.ttl()).unwrap_or(0),
                ))),
                Ok(Some(_)) => Ok(None),
                Ok(None) => Err(Error::storage("the keep-alive stream ended").temporary()),
                Err(e) => Err(failure(e)),
            }
        })
        .await;
        match answer {
            Ok(r) => r.map_err(|e| self.core.fail(e)),
            Err(_) => Err(self.core.fail(
                Error::storage("etcd did not answer a keep-alive within the request timeout")
                    .temporary(),
            )),
        }
    }
}

/// A keep-alive's failure as this library's error.
fn failure(err: etcd_client::Error) -> Error {
    super::conn::failure("lease keep-alive", err)
}
