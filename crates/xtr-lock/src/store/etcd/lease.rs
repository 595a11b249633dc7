//! A holder's lease and the task that keeps it alive.
//!
//! The lease is granted on the holder's first acquire and kept alive (a keep-alive every third
//! of its ttl, or the DSN's `keepalive`) until the holder's key goes, when it is revoked: that
//! deletes every key on it at once. Between holds it stays, so the next acquire costs one
//! round trip. The task says the lease is gone when etcd answers a keep-alive with a ttl of 0
//! (expired, revoked), or at the end the last answered keep-alive confirmed (its send time plus
//! the ttl it answered) when none has been answered since: the cluster unreachable or without
//! a quorum, the lease may have expired there, and the holder cannot know that it did not.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::{mpsc, oneshot, watch};

use super::conn::Core;
use crate::error::{Error, LostReason, Result};
use crate::key::later;

/// Whether the lease lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Alive,
    Gone(LostReason),
}

/// A granted lease and its keeper.
pub(super) struct Lease {
    pub(super) id: i64,
    /// Until when the server has certainly kept the lease: the send time of the last answered
    /// keep-alive (or of the grant) plus the granted ttl.
    pub(super) confirmed: Arc<std::sync::Mutex<Instant>>,
    /// The ttl asked for (whole seconds); the server may have granted more.
    pub(super) asked: Duration,
    pub(super) state: watch::Receiver<State>,
    refresh: mpsc::UnboundedSender<oneshot::Sender<Result<Duration>>>,
    task: tokio::task::AbortHandle,
}

impl Lease {
    /// Grants a lease of `ttl` and starts keeping it alive.
    pub(super) async fn grant(core: &Arc<Core>, ttl: Duration) -> Result<Lease> {
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let sent = Instant::now();
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
        let confirmed = Arc::new(std::sync::Mutex::new(later(sent, granted_ttl)));
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
            state,
            refresh,
            task,
        })
    }

    /// Whether the keeper still believes the lease lives.
    pub(super) fn alive(&self) -> bool {
        *self.state.borrow() == State::Alive
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

    /// Stops keeping it alive and revokes it in the background (its keys go with it).
    pub(super) fn revoke(self, core: &Arc<Core>) {
        self.task.abort();
        if *self.state.borrow() != State::Alive {
            return;
        }
        let core = core.clone();
        let id = self.id;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let revoked = core
                    .call(
                        "lease revoke",
                        |mut c| async move { c.lease_revoke(id).await },
                    )
                    .await;
                if let Err(e) = revoked {
                    tracing::debug!(target: crate::logging::TARGET, lease = %format!("{id:x}"),
                        error = %e, "cannot revoke a lease; it ends at its ttl");
                }
            });
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
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    /// The send time of the last answered keep-alive (or of the grant) plus the ttl it
    /// answered: until then the lease certainly lasts.
    confirmed: Arc<std::sync::Mutex<Instant>>,
    state: watch::Sender<State>,
    requests: mpsc::UnboundedReceiver<oneshot::Sender<Result<Duration>>>,
}

impl Keeper {
    async fn run(mut self) {
        let mut waiting: Vec<oneshot::Sender<Result<Duration>>> = Vec::new();
        let mut pause = self.period;
        loop {
            // Never sleep past the lease's confirmed end: the loss is reported at that moment.
            let until_end = self.confirmed().saturating_duration_since(Instant::now());
            tokio::select! {
                () = tokio::time::sleep(pause.min(until_end)) => {}
                request = self.requests.recv() => match request {
                    Some(reply) => waiting.push(reply),
                    None => return,
                },
            }
            while let Ok(reply) = self.requests.try_recv() {
                waiting.push(reply);
            }
            let end = self.confirmed();
            let sent = Instant::now();
            // An attempt still unanswered when the lease's confirmed end comes is too late.
            let attempt =
                tokio::time::timeout_at(tokio::time::Instant::from_std(end), self.once()).await;
            match attempt {
                Ok(Ok(Some(left))) => {
                    *self.confirmed.lock().unwrap_or_else(|e| e.into_inner()) = later(sent, left);
                    pause = self.period;
                    for reply in waiting.drain(..) {
                        let _ = reply.send(Ok(left));
                    }
                }
                Ok(Ok(None)) => {
                    tracing::warn!(target: crate::logging::TARGET, store = %self.core.shown,
                        lease = %format!("{:x}", self.id), "the lease expired or was revoked");
                    return self.gone(waiting, LostReason::Expired);
                }
                Err(_) => {
                    tracing::warn!(target: crate::logging::TARGET, store = %self.core.shown,
                        lease = %format!("{:x}", self.id),
                        "no keep-alive answered before the lease's confirmed end");
                    return self.gone(waiting, LostReason::Expired);
                }
                Ok(Err(e)) => {
                    self.stream = None;
                    if Instant::now() >= end {
                        tracing::warn!(target: crate::logging::TARGET, store = %self.core.shown,
                            lease = %format!("{:x}", self.id), error = %e,
                            "no keep-alive answered before the lease's confirmed end");
                        return self.gone(waiting, LostReason::Expired);
                    }
                    tracing::debug!(target: crate::logging::TARGET, store = %self.core.shown,
                        error = %e, "a keep-alive failed; trying again");
                    for reply in waiting.drain(..) {
                        let again = Error::storage(e.reason().unwrap_or("a keep-alive failed"));
                        let _ = reply.send(Err(self.core.fail(again.temporary())));
                    }
                    // Again soon, within what is left of the lease.
                    pause =
                        (self.period / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
                }
            }
        }
    }

    /// Until when the lease certainly lasts.
    fn confirmed(&self) -> Instant {
        *self.confirmed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn gone(&self, waiting: Vec<oneshot::Sender<Result<Duration>>>, why: LostReason) {
        self.state.send_replace(State::Gone(why));
        for reply in waiting {
            let _ = reply.send(Err(self
                .core
                .fail(Error::storage("the lease is gone (expired or revoked)"))));
        }
    }

    /// One keep-alive: the remaining ttl, `None` when the lease is gone.
    async fn once(&mut self) -> Result<Option<Duration>> {
        let timeout = self.core.config.request_timeout;
        let answer = tokio::time::timeout(timeout, async {
            if self.stream.is_none() {
                let client = self.core.client().await?;
                let id = self.id;
                let mut lease = client.lease_client();
                match lease.keep_alive(id).await {
                    Ok(stream) => self.stream = Some(stream),
                    Err(etcd_client::Error::LeaseKeepAliveError(_)) => return Ok(None),
                    Err(e) => return Err(super::conn::failure("lease keep-alive", e)),
                }
                // Opening the stream sent a keep-alive, and its answer was a live lease.
                return Ok(Some(self.ttl));
            }
            let (keeper, stream) = self.stream.as_mut().expect("a stream");
            keeper
                .keep_alive()
                .await
                .map_err(|e| super::conn::failure("lease keep-alive", e))?;
            match stream.message().await {
                Ok(Some(answer)) if answer.ttl() > 0 => Ok(Some(Duration::from_secs(
                    u64::try_from(answer.ttl()).unwrap_or(0),
                ))),
                Ok(Some(_)) => Ok(None),
                Ok(None) => Err(Error::storage("the keep-alive stream ended").temporary()),
                Err(e) => Err(super::conn::failure("lease keep-alive", e)),
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
