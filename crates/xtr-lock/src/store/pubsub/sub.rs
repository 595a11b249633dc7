//! A holder's subscription: the dedicated connection that *is* the lock, named
//! `C-lock-<id>` before it subscribes to `C`, and the task that answers every ping on it from
//! the holder's `(mode, elected)` snapshot, pings it to find a half-open connection, and says
//! when it is gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot, watch};

use super::conn::{Conns, redis_error, spawn_background};
use super::decide::{self, Wire};
use crate::error::Result;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

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

    pub(super) fn mute(&self) {
        self.mute.store(true, Ordering::Release);
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
        health_check: Duration,
        read_fence: bool,
    ) -> Result<(Sub, u64, Option<u64>)> {
        let name = decide::connection_name(channel, id);
        let ((conn, rx), mut spare) = conns.fresh().await?;
        let (mut conn, mut rx) = (conn, rx);
        let (count, fence) = loop {
            match handshake(&conn, &name, channel, read_fence).await {
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
            health_check,
            conns.response_timeout,
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
    read_fence: bool,
) -> redis::RedisResult<(u64, Option<u64>)> {
    let (mut a, mut b, mut c, mut d) = (conn.clone(), conn.clone(), conn.clone(), conn.clone());
    let setname = redis::cmd("CLIENT").arg("SETNAME").arg(name).clone();
    let numsub = redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).clone();
    let get = redis::cmd("GET").arg(format!("{channel}-fence")).clone();
    // `join!` polls in order, and each request is queued at its first poll.
    let (named, subscribed, counted, fenced) = tokio::join!(
        setname.query_async::<()>(&mut a),
        b.subscribe(channel),
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
    health_check: Duration,
    response_timeout: Duration,
) {
    let mut health =
        tokio::time::interval_at(tokio::time::Instant::now() + health_check, health_check);
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = loop {
        tokio::select! {
            biased;
            req = &mut close => {
                if let Ok(done) = req {
                    let live = shared.life() == Life::Live;
                    // The notice after the unsubscribe, on this connection: the server runs
                    // them in order, so a waiter it wakes no longer counts this holder.
                    let mut notify = conn.clone();
                    let notice = redis::cmd("PUBLISH").arg(notice_channel(&shared.channel)).arg("").clone();
                    let unsubscribed = tokio::time::timeout(response_timeout, async {
                        let (unsubscribed, _) = tokio::join!(
                            conn.unsubscribe(&shared.channel),
                            notice.query_async::<Value>(&mut notify)
                        );
                        unsubscribed
                    })
                    .await;
                    drop((conn, notify));
                    shared.life.send_replace(Life::Closed);
                    let _ = done.send(live && matches!(unsubscribed, Ok(Ok(()))));
                    return;
                }
                break Life::Closed;
            }
            push = pushes.recv() => match push {
                None => break Life::Lost,
                Some(push) if push.kind == PushKind::Disconnection => break Life::Lost,
                Some(push) => on_push(&shared, &conns, push),
            },
            _ = health.tick() => {
                let ping = redis::cmd("PING");
                match tokio::time::timeout(response_timeout, ping.query_async::<Value>(&mut conn)).await {
                    Ok(Ok(_)) => {}
                    _ => break Life::Lost,
                }
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
