//! The store's shared connections: the command connection (counts, pings, replies, reaping,
//! fencing; reconnecting) and the listener (probe response channels and release notices; one
//! RESP3 connection, made again when it dies). Holders' subscriptions are in `sub.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use tokio::sync::{mpsc, watch};

use super::config::PubSubConfig;
use crate::error::{Error, Result};
use crate::mutex::lock;
use crate::store::redis::{NOT_REDIS, speaks_another_protocol};

/// A Redis error as this store's: temporary when it is the connection's fault.
pub(super) fn redis_error(what: &str, err: &redis::RedisError) -> Error {
    if speaks_another_protocol(err) {
        return Error::storage(format!("{what}: {NOT_REDIS}"));
    }
    let temporary = err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal();
    let detail = match err.detail() {
        Some(d) => format!("{}: {d}", err.code().unwrap_or("error")),
        None => err.to_string(),
    };
    // The client's own words (as the Redis store shows them): they never hold the DSN.
    let e = Error::storage(format!("{what}: {detail}"));
    if temporary { e.temporary() } else { e }
}

/// The runtime the store's connections and answering tasks run on: a thread of its own, so a
/// holder answers pings even while its user's code blocks the user's runtime (portalocker's
/// holders are reaped then; ours are not).
fn background() -> &'static tokio::runtime::Handle {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime for the pub/sub store");
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("xtr-lock-pubsub".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .expect("a thread for the pub/sub store");
        handle
    })
}

/// Runs `fut` on the store's own runtime (see [`background`]). Dropped, the work goes on
/// there and what it made is dropped when it finishes.
pub(super) async fn on_background<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    match background().spawn(fut).await {
        Ok(value) => value,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => unreachable!("the store's runtime is never shut down"),
    }
}

/// Starts `fut` on the store's own runtime, for as long as it runs.
pub(super) fn spawn_background(fut: impl std::future::Future<Output = ()> + Send + 'static) {
    background().spawn(fut);
}

pub(super) struct Conns {
    /// As the user configured it (RESP2 unless told otherwise): the command connection.
    client: redis::Client,
    /// The same server in RESP3: subscriptions and the listener, with their pushes.
    resp3: redis::Client,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    command: tokio::sync::Mutex<Option<ConnectionManager>>,
    listener: tokio::sync::Mutex<Option<Arc<Listener>>>,
    /// A connection opened ahead, never used yet: the next subscription takes it and saves the
    /// connect and handshake round trips (it is still a fresh connection of its own).
    spare: Mutex<Option<Fresh>>,
}

/// A new RESP3 connection and its pushes.
pub(super) type Fresh = (MultiplexedConnection, mpsc::UnboundedReceiver<PushInfo>);

impl Conns {
    pub(super) fn new(config: &PubSubConfig) -> Result<Conns> {
        let client = redis::Client::open(config.redis.client_url.as_str())
            .map_err(|e| redis_error("the Redis client refuses the connection string", &e))?;
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let resp3 = redis::Client::open(info.set_redis_settings(settings))
            .map_err(|e| redis_error("the Redis client refuses RESP3", &e))?;
        Ok(Conns {
            client,
            resp3,
            connect_timeout: config.redis.connect_timeout,
            response_timeout: config.redis.response_timeout,
            command: tokio::sync::Mutex::new(None),
            listener: tokio::sync::Mutex::new(None),
            spare: Mutex::new(None),
        })
    }

    /// The command connection (reconnecting: nothing of a lock lives on it).
    pub(super) async fn command(&self) -> Result<ConnectionManager> {
        let mut slot = self.command.lock().await;
        if let Some(conn) = slot.as_ref() {
            return Ok(conn.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(1);
        let client = self.client.clone();
        // The manager tries twice, each try bounded by the connect timeout: a server that
        // accepts but never answers (paused) would cost both.
        let connect = ConnectionManager::new_with_config(client, config);
        let conn = tokio::time::timeout(self.connect_timeout, on_background(connect))
            .await
            .map_err(|_| {
                Error::storage(format!(
                    "cannot connect to Redis: no answer within {:?}",
                    self.connect_timeout
                ))
                .temporary()
            })?
            .map_err(|e| redis_error("cannot connect to Redis", &e))?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// A new RESP3 connection whose pushes go to `pushes` (a holder's subscription, the
    /// listener). Never reconnected: when it dies, `pushes` gets a disconnection.
    pub(super) async fn dedicated(
        &self,
        pushes: impl redis::aio::AsyncPushSender,
    ) -> Result<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_push_sender(pushes);
        let client = self.resp3.clone();
        on_background(async move {
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
        })
        .await
        .map_err(|e| redis_error("cannot connect to Redis", &e))
    }

    /// A connection for a new subscription: the spare when there is a live one (another is
    /// opened behind it), else a new one. `spare` says which.
    pub(super) async fn fresh(self: &Arc<Self>) -> Result<(Fresh, bool)> {
        let spare = lock(&self.spare).take();
        self.refill();
        if let Some((conn, mut pushes)) = spare {
            // A spare that died while idle says so in its pushes; it has no other.
            if matches!(pushes.try_recv(), Err(mpsc::error::TryRecvError::Empty)) {
                return Ok(((conn, pushes), true));
            }
        }
        let (tx, pushes) = mpsc::unbounded_channel();
        Ok(((self.dedicated(tx).await?, pushes), false))
    }

    /// Opens a spare connection in the background, unless there is one.
    fn refill(self: &Arc<Self>) {
        let conns = self.clone();
        spawn_background(async move {
            if lock(&conns.spare).is_some() {
                return;
            }
            let (tx, pushes) = mpsc::unbounded_channel();
            if let Ok(conn) = conns.dedicated(tx).await {
                let mut slot = lock(&conns.spare);
                if slot.is_none() {
                    *slot = Some((conn, pushes));
                }
            }
        });
    }

    /// The listener, made (again) when there is none or it died.
    pub(super) async fn listener(&self) -> Result<Arc<Listener>> {
        let mut slot = self.listener.lock().await;
        if let Some(l) = slot.as_ref()
            && !l.dead.load(Ordering::Acquire)
        {
            return Ok(l.clone());
        }
        let routes: Arc<Mutex<Routes>> = Arc::default();
        let dead = Arc::new(AtomicBool::new(false));
        let sender = {
            let (routes, dead) = (routes.clone(), dead.clone());
            move |push: PushInfo| {
                route(&routes, &dead, push);
                Ok::<(), redis::aio::SendError>(())
            }
        };
        let conn = self.dedicated(sender).await?;
        let l = Arc::new(Listener { conn, routes, dead });
        *slot = Some(l.clone());
        Ok(l)
    }

    /// Drops the shared connections (the next use makes new ones).
    pub(super) async fn close(&self) {
        self.command.lock().await.take();
        self.listener.lock().await.take();
        lock(&self.spare).take();
    }
}

#[derive(Default)]
struct Routes {
    replies: HashMap<Vec<u8>, mpsc::UnboundedSender<Vec<u8>>>,
    notices: HashMap<Vec<u8>, (watch::Sender<u64>, usize)>,
}

/// Delivers one push of the listener: a reply to its probe, a notice to its waiters; a
/// disconnection ends every probe (their receivers close) and wakes every waiter (they try
/// again and listen on a new listener).
fn route(routes: &Mutex<Routes>, dead: &AtomicBool, push: PushInfo) {
    match push.kind {
        PushKind::Message => {
            let (Some(Value::BulkString(channel)), Some(payload)) =
                (push.data.first(), push.data.get(1))
            else {
                return;
            };
            let payload = match payload {
                Value::BulkString(b) => b.clone(),
                Value::SimpleString(s) => s.clone().into_bytes(),
                _ => return,
            };
            let routes = lock(routes);
            if let Some(tx) = routes.replies.get(channel) {
                let _ = tx.send(payload);
            } else if let Some((notices, _)) = routes.notices.get(channel) {
                notices.send_modify(|n| *n += 1);
            }
        }
        PushKind::Disconnection => {
            dead.store(true, Ordering::Release);
            let mut routes = lock(routes);
            routes.replies.clear();
            for (notices, _) in routes.notices.values() {
                notices.send_modify(|n| *n += 1);
            }
        }
        _ => {}
    }
}

/// One RESP3 connection subscribed to the response channels of this store's probes and to
/// the release-notice channels its waiters listen on. Never a lock channel: it is unnamed and
/// would make every probe of that channel inconclusive.
pub(super) struct Listener {
    conn: MultiplexedConnection,
    routes: Arc<Mutex<Routes>>,
    dead: Arc<AtomicBool>,
}

impl Listener {
    /// Subscribes to `channel` for one probe's replies; confirmed when this returns.
    pub(super) async fn replies(self: &Arc<Self>, channel: String) -> Result<Replies> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.routes)
            .replies
            .insert(channel.clone().into_bytes(), tx);
        let replies = Replies {
            rx,
            channel,
            listener: self.clone(),
        };
        let mut conn = self.conn.clone();
        conn.subscribe(&replies.channel)
            .await
            .map_err(|e| redis_error("cannot subscribe to a probe's response channel", &e))?;
        Ok(replies)
    }

    /// Listens for release notices on `channel` until the returned guard goes; confirmed when
    /// this returns. Waiters of one resource share the subscription.
    pub(super) async fn notices(self: &Arc<Self>, channel: String) -> Result<Notices> {
        let key = channel.clone().into_bytes();
        let (rx, first) = {
            let mut routes = lock(&self.routes);
            let entry = routes
                .notices
                .entry(key)
                .or_insert_with(|| (watch::channel(0).0, 0));
            entry.1 += 1;
            (entry.0.subscribe(), entry.1 == 1)
        };
        let notices = Notices {
            rx,
            channel,
            listener: self.clone(),
        };
        if first {
            let mut conn = self.conn.clone();
            conn.subscribe(&notices.channel)
                .await
                .map_err(|e| redis_error("cannot subscribe to release notices", &e))?;
        }
        Ok(notices)
    }

    /// A round trip on the listener's connection: every reply the server sent before it has
    /// been routed when this returns (pushes and answers come in order on one connection).
    pub(super) async fn barrier(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<Value>(&mut conn)
            .await
            .map(drop)
            .map_err(|e| redis_error("cannot reach the probe listener's connection", &e))
    }

    fn unsubscribe_later(&self, channel: String) {
        if self.dead.load(Ordering::Acquire) {
            return;
        }
        let mut conn = self.conn.clone();
        background().spawn(async move {
            let _ = conn.unsubscribe(&channel).await;
        });
    }
}

/// One probe's replies, in arrival order. Unsubscribes when dropped.
pub(super) struct Replies {
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    channel: String,
    listener: Arc<Listener>,
}

impl Replies {
    /// The next reply within `wait`: `Err(())` when the listener died.
    pub(super) async fn next(
        &mut self,
        wait: Duration,
    ) -> std::result::Result<Option<Vec<u8>>, ()> {
        match tokio::time::timeout(wait, self.rx.recv()).await {
            Ok(Some(r)) => Ok(Some(r)),
            Ok(None) => Err(()),
            Err(_) => Ok(None),
        }
    }

    /// A reply already here, without waiting.
    pub(super) fn ready(&mut self) -> std::result::Result<Option<Vec<u8>>, ()> {
        match self.rx.try_recv() {
            Ok(r) => Ok(Some(r)),
            Err(mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(mpsc::error::TryRecvError::Disconnected) => Err(()),
        }
    }
}

impl Drop for Replies {
    fn drop(&mut self) {
        lock(&self.listener.routes)
            .replies
            .remove(self.channel.as_bytes());
        self.listener
            .unsubscribe_later(std::mem::take(&mut self.channel));
    }
}

/// A waiter's interest in release notices of one resource.
pub(super) struct Notices {
    rx: watch::Receiver<u64>,
    channel: String,
    listener: Arc<Listener>,
}

impl Notices {
    /// Forgets the notices seen so far: [`changed`](Notices::changed) waits for one after this.
    pub(super) fn mark(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Completes at the first notice since the last [`mark`](Notices::mark) (at once when one
    /// came meanwhile), or when the listener died.
    pub(super) async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether the listener behind these notices died (the waiter should listen again).
    pub(super) fn is_dead(&self) -> bool {
        self.listener.dead.load(Ordering::Acquire)
    }
}

impl Drop for Notices {
    fn drop(&mut self) {
        let last = {
            let mut routes = lock(&self.listener.routes);
            match routes.notices.get_mut(self.channel.as_bytes()) {
                Some(entry) if entry.1 <= 1 => {
                    routes.notices.remove(self.channel.as_bytes());
                    true
                }
                Some(entry) => {
                    entry.1 -= 1;
                    false
                }
                None => false,
            }
        };
        if last {
            self.listener
                .unsubscribe_later(std::mem::take(&mut self.channel));
        }
    }
}
