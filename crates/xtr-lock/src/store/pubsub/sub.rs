//! A holder's subscription: the dedicated connection that *is* the lock, named
//! `C-lock-<id>` before it subscribes to `C`, and the task that answers every ping on it from
//! the holder's `(mode, elected)` snapshot, checks itself (a message to itself every
//! `unavailable_timeout / 4`, on the path a ping's answer takes) to know how long its lock
//! certainly lasts, and says when it is gone.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot, watch};

use super::conn::{Conns, redis_error, spawn_background};
use super::decide::{self, Wire};
use super::probe::Timing;
use crate::error::Result;
use crate::mutex::lock;

/// Whether the subscription is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Life {
    Live,
    /// Closed by its holder (release, give-up).
    Closed,
    /// Gone without its holder: the connection dropped, was killed, or stopped answering.
    Lost,
}

/// What the answering task and the holder share.
pub(super) struct Shared {
    pub(super) id: String,
    pub(super) channel: String,
    /// `(mode, elected)`, one snapshot: every promotion and demotion takes this mutex, and so
    /// does every answer.
    snap: Mutex<(Wire, bool)>,
    life: watch::Sender<Life>,
    /// A test hook: stop answering pings (a wedged holder, as the reaping tests need).
    mute: AtomicBool,
    /// When the last self-check that came back was sent: the subscription was certainly
    /// counted and reachable then.
    confirmed: Mutex<Instant>,
    /// How long after a confirmed self-check the lock certainly lasts: a prober kills a
    /// holder that leaves its ping unanswered for `unavailable_timeout`, less a margin.
    lease: Duration,
}

impl Shared {
    pub(super) fn snapshot(&self) -> (Wire, bool) {
        *lock(&self.snap)
    }

    pub(super) fn set(&self, mode: Wire, elected: bool) {
        *lock(&self.snap) = (mode, elected);
    }

    pub(super) fn life(&self) -> Life {
        *self.life.borrow()
    }

    /// The test hook's (`stop_answering`): this holder stops answering, as a wedged one would.
    #[cfg(feature = "test-util")]
    pub(super) fn mute(&self) {
        self.mute.store(true, Ordering::Release);
    }

    /// When the lock stops being certain if no self-check comes back from now on.
    pub(super) fn lease_end(&self) -> Instant {
        *lock(&self.confirmed) + self.lease
    }

    /// How long the lock certainly lasts from now if nothing is confirmed any more; `None`
    /// once the subscription is gone.
    pub(super) fn lease_remaining(&self) -> Option<Duration> {
        (self.life() == Life::Live)
            .then(|| self.lease_end().saturating_duration_since(Instant::now()))
    }

    /// A self-check sent at `sent` came back.
    fn confirm(&self, sent: Instant) {
        let mut confirmed = lock(&self.confirmed);
        *confirmed = (*confirmed).max(sent);
    }

    /// Completes when the subscription is no longer live.
    pub(super) fn ended(&self) -> impl std::future::Future<Output = Life> + Send + 'static {
        let mut rx = self.life.subscribe();
        async move {
            loop {
                let now = *rx.borrow_and_update();
                if now != Life::Live {
                    return now;
                }
                if rx.changed().await.is_err() {
                    return Life::Lost;
                }
            }
        }
    }
}

/// One live subscription. Dropping it closes the connection at once (its task ends); `close`
/// unsubscribes first, so the server's count no longer includes it when `close` returns.
pub(super) struct Sub {
    pub(super) shared: Arc<Shared>,
    close: Option<oneshot::Sender<oneshot::Sender<bool>>>,
}

impl Sub {
    /// Opens a connection, names it, subscribes it to `channel` (confirmed), and starts
    /// answering pings as `mode`. The name, the subscription and a count of the channel (and,
    /// with `read_fence`, the fencing counter) go out in one round trip on this connection, in
    /// that order, so the count includes this subscription. Returns the count and the counter.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, the connection it opened closes with it.
    pub(super) async fn open(
        conns: &Arc<Conns>,
        channel: &str,
        id: &str,
        mode: Wire,
        timing: Timing,
        read_fence: bool,
    ) -> Result<(Sub, u64, Option<u64>)> {
        let name = decide::connection_name(channel, id);
        let ((conn, rx), mut spare) = conns.fresh().await?;
        let (mut conn, mut rx) = (conn, rx);
        let mut sent;
        let (count, fence) = loop {
            sent = Instant::now();
            match handshake(&conn, &name, channel, id, read_fence).await {
                Ok(found) => break found,
                // A spare may have died a moment ago: once more on a new connection.
                Err(e) if spare && (e.is_io_error() || e.is_connection_dropped()) => {
                    spare = false;
                    let (tx, fresh_rx) = mpsc::unbounded_channel::<PushInfo>();
                    conn = conns.dedicated(tx).await?;
                    rx = fresh_rx;
                }
                Err(e) => return Err(redis_error("cannot subscribe to the lock channel", &e)),
            }
        };
        let shared = Arc::new(Shared {
            id: id.to_owned(),
            channel: channel.to_owned(),
            snap: Mutex::new((mode, false)),
            life: watch::channel(Life::Live).0,
            mute: AtomicBool::new(false),
            // The subscription confirmed is the first proof.
            confirmed: Mutex::new(sent),
            lease: timing.lease(),
        });
        let (close_tx, close_rx) = oneshot::channel();
        // On the store's own runtime, with the connection's driver: answering never waits for
        // the user's runtime.
        spawn_background(answer(
            conn,
            rx,
            close_rx,
            shared.clone(),
            conns.clone(),
            timing,
        ));
        Ok((
            Sub {
                shared,
                close: Some(close_tx),
            },
            count,
            fence,
        ))
    }

    pub(super) fn is_live(&self) -> bool {
        self.shared.life() == Life::Live
    }

    /// Unsubscribes (confirmed, or the connection is dropped after the response timeout) and
    /// closes the connection. Whether it was still subscribed: the server confirmed the
    /// unsubscribe (a connection killed a moment ago, whose end this process has not read yet,
    /// cannot).
    pub(super) async fn close(mut self) -> bool {
        let Some(close) = self.close.take() else {
            return false;
        };
        let (done_tx, done_rx) = oneshot::channel();
        if close.send(done_tx).is_err() {
            return false;
        }
        done_rx.await.unwrap_or(false)
    }
}

impl Drop for Sub {
    fn drop(&mut self) {
        // Dropping the sender ends the task, which drops the connection.
        self.close.take();
        self.shared.life.send_if_modified(|life| {
            if *life == Life::Live {
                *life = Life::Closed;
                true
            } else {
                false
            }
        });
    }
}

/// `CLIENT SETNAME`, `SUBSCRIBE`, `PUBSUB NUMSUB` (and `GET <channel>-fence`), pipelined on
/// the new connection: the server runs them in order.
async fn handshake(
    conn: &MultiplexedConnection,
    name: &str,
    channel: &str,
    id: &str,
    read_fence: bool,
) -> redis::RedisResult<(u64, Option<u64>)> {
    let (mut a, mut b, mut c, mut d) = (conn.clone(), conn.clone(), conn.clone(), conn.clone());
    let setname = redis::cmd("CLIENT").arg("SETNAME").arg(name).clone();
    let numsub = redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).clone();
    let get = redis::cmd("GET").arg(format!("{channel}-fence")).clone();
    // The lock channel and the one for self-checks, in one command.
    let own = self_channel(channel, id);
    let channels = [channel, own.as_str()];
    // `join!` polls in order, and each request is queued at its first poll.
    let (named, subscribed, counted, fenced) = tokio::join!(
        setname.query_async::<()>(&mut a),
        b.subscribe(&channels),
        numsub.query_async::<Vec<Value>>(&mut c),
        async {
            if read_fence {
                get.query_async::<Option<String>>(&mut d).await.map(Some)
            } else {
                Ok(None)
            }
        }
    );
    named?;
    subscribed?;
    let count = match counted?.get(1) {
        Some(Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    };
    let fence = fenced?.map(|v| v.and_then(|v| v.parse().ok()).unwrap_or(0));
    Ok((count, fence))
}

/// The task behind a subscription.
async fn answer(
    mut conn: MultiplexedConnection,
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    mut close: oneshot::Receiver<oneshot::Sender<bool>>,
    shared: Arc<Shared>,
    conns: Arc<Conns>,
    timing: Timing,
) {
    let response_timeout = conns.response_timeout;
    let mut health = tokio::time::interval_at(
        tokio::time::Instant::now() + timing.health_check,
        timing.health_check,
    );
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The subscription's confirmation is the first proof; the first check one period on.
    let mut checks = tokio::time::interval_at(
        tokio::time::Instant::now() + timing.self_check(),
        timing.self_check(),
    );
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut check = SelfCheck::new(self_channel(&shared.channel, &shared.id));
    let end = loop {
        let lease_end = tokio::time::Instant::from_std(shared.lease_end());
        tokio::select! {
            biased;
            req = &mut close => {
                if let Ok(done) = req {
                    let live = shared.life() == Life::Live;
                    let unsubscribed = unsubscribe(conn, &shared.channel, response_timeout).await;
                    shared.life.send_replace(Life::Closed);
                    let _ = done.send(live && unsubscribed);
                    return;
                }
                break Life::Closed;
            }
            push = pushes.recv() => match push {
                None => break Life::Lost,
                Some(push) if push.kind == PushKind::Disconnection => break Life::Lost,
                Some(push) => match check.back(&push) {
                    // A muted holder (wedged, as the test hook has it) confirms nothing either.
                    Some(sent) if !shared.mute.load(Ordering::Acquire) => shared.confirm(sent),
                    Some(_) => {}
                    None => on_push(&shared, &conns, push),
                },
            },
            _ = health.tick() => {
                let ping = redis::cmd("PING");
                match tokio::time::timeout(response_timeout, ping.query_async::<Value>(&mut conn)).await {
                    Ok(Ok(_)) => {}
                    _ => break Life::Lost,
                }
            }
            _ = checks.tick() => check.send(&conns, response_timeout),
            () = tokio::time::sleep_until(lease_end) => {
                // No self-check came back for the lease: a prober may kill this subscription
                // any moment now (a half-open connection, a paused server or process). Give it
                // up and say so before someone else can take the lock.
                tracing::warn!(target: crate::logging::TARGET, channel = %shared.channel,
                    "no self-check came back within the lease: the lock is given up as lost");
                break Life::Lost;
            }
        }
    };
    drop(conn);
    shared.life.send_if_modified(|life| {
        if *life == Life::Live {
            *life = end;
            true
        } else {
            false
        }
    });
}

/// Unsubscribes, then publishes the release notice on this connection (the server runs them
/// in order, so a waiter it wakes no longer counts this holder), and drops the connection.
/// Whether the unsubscribe was confirmed within `timeout`.
async fn unsubscribe(mut conn: MultiplexedConnection, channel: &str, timeout: Duration) -> bool {
    let mut notify = conn.clone();
    let notice = redis::cmd("PUBLISH")
        .arg(notice_channel(channel))
        .arg("")
        .clone();
    let unsubscribed = tokio::time::timeout(timeout, async {
        let (unsubscribed, _) = tokio::join!(
            conn.unsubscribe(channel),
            notice.query_async::<Value>(&mut notify)
        );
        unsubscribed
    })
    .await;
    matches!(unsubscribed, Ok(Ok(())))
}

/// The channel only one subscription listens on, for its self-checks: no lock channel can
/// have this name (it holds spaces).
fn self_channel(channel: &str, id: &str) -> String {
    format!("{channel} xtr-lock-self-check {id}")
}

/// A subscription's self-checks: a message sent from the command connection to a channel only
/// this subscription listens on. One that comes back proves that the path a ping's answer
/// takes worked when it was sent: the server counted the subscription and reached it, and
/// took a command from this process. Probers kill a holder `unavailable_timeout` after a ping
/// it left unanswered, so the lock certainly lasts that long after the last proof.
struct SelfCheck {
    channel: String,
    next: u64,
    /// Sent and not back yet: the sequence number and the send time (the last few).
    pending: VecDeque<(u64, Instant)>,
}

impl SelfCheck {
    fn new(channel: String) -> SelfCheck {
        SelfCheck {
            channel,
            next: 0,
            pending: VecDeque::new(),
        }
    }

    /// Sends the next check (given up after `timeout`: a later one can still come back).
    fn send(&mut self, conns: &Arc<Conns>, timeout: Duration) {
        self.next += 1;
        self.pending.push_back((self.next, Instant::now()));
        if self.pending.len() > 32 {
            self.pending.pop_front();
        }
        let conns = conns.clone();
        let publish = redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg(self.next.to_string())
            .clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, async {
                if let Ok(mut cmd) = conns.command().await {
                    let _ = publish.query_async::<Value>(&mut cmd).await;
                }
            })
            .await;
        });
    }

    /// The send time of the check `push` brings back, if it is one.
    fn back(&mut self, push: &PushInfo) -> Option<Instant> {
        if push.kind != PushKind::Message {
            return None;
        }
        let (Some(Value::BulkString(channel)), Some(Value::BulkString(payload))) =
            (push.data.first(), push.data.get(1))
        else {
            return None;
        };
        if channel.as_slice() != self.channel.as_bytes() {
            return None;
        }
        let seq: u64 = std::str::from_utf8(payload).ok()?.parse().ok()?;
        let at = self.pending.iter().position(|(s, _)| *s == seq)?;
        let sent = self.pending[at].1;
        self.pending.drain(..=at);
        Some(sent)
    }
}

/// The channel this library's waiters of `channel` hear releases on: no lock channel can
/// have this name (it holds a space).
pub(super) fn notice_channel(channel: &str) -> String {
    format!("{channel} xtr-lock-released")
}

/// Answers a ping on the lock channel (anything else is ignored, whatever its bytes).
fn on_push(shared: &Arc<Shared>, conns: &Arc<Conns>, push: PushInfo) {
    if push.kind != PushKind::Message || shared.mute.load(Ordering::Acquire) {
        return;
    }
    let (Some(Value::BulkString(channel)), Some(Value::BulkString(payload))) =
        (push.data.first(), push.data.get(1))
    else {
        return;
    };
    if channel.as_slice() != shared.channel.as_bytes() {
        return;
    }
    let Some(response_channel) = decide::response_channel(payload) else {
        return;
    };
    let (mode, elected) = shared.snapshot();
    let reply = decide::reply(&shared.id, mode, elected);
    let conns = conns.clone();
    tokio::spawn(async move {
        if let Ok(mut cmd) = conns.command().await {
            let _ = redis::cmd("PUBLISH")
                .arg(&response_channel)
                .arg(&reply)
                .query_async::<Value>(&mut cmd)
                .await;
        }
    });
}
