//! [`RedisPubSubStore`]: the Redis pub/sub liveness lock (portalocker 4.x's protocol; see
//! docs/pubsub.md): a lock is a live subscription, released the instant its holder's
//! connection closes.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Capabilities, HandleOwner, HolderInfo, Holding, LossWatcher, LostReason, Saved, Store,
};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};

mod acquire;
mod attempt;
mod config;
mod conn;
mod decide;
mod probe;
mod sub;

use crate::mutex::lock;
use config::PubSubConfig;
use conn::{Conns, redis_error};
use decide::Wire;
use probe::Timing;
use sub::{Life, Shared, Sub};

/// The token kind of pub/sub stores.
const KIND: &str = "pubsub";

/// How often a waiter asks how many are subscribed to its channel.
const COUNT_POLL: Duration = Duration::from_millis(2);

/// Checks a pub/sub DSN without building anything.
pub(crate) fn validate_dsn(dsn: &str) -> Result<()> {
    config::parse(dsn).map(|_| ())
}

/// Locks that are live Redis subscriptions, on the protocol of portalocker 4.x's `RedisLock`
/// (protocol version 1), so Rust processes and Python processes on portalocker 4.2–4.4 share
/// one lock channel: readers in mode `shared`, writers `pending` until the lowest id among them
/// is elected and promotes itself to `exclusive`, then confirms.
///
/// - **No key is written**: the lock on `resource` is held by a dedicated connection named
///   `<prefix><resource>-lock-<32 hex>`, subscribed to the channel `<prefix><resource>`. A
///   task of this store answers every ping on it at once, from the holder's mode, so a holder
///   is never mistaken for a dead one while its own code is busy.
/// - **Released the instant its holder dies**: Redis drops the subscription with the
///   connection. Releasing unsubscribes (one round trip) and tells this library's waiters on a
///   notice channel of its own, `<channel> xtr-lock-released` (a name no lock channel can
///   have: it holds a space), so they try at once; Python holders' releases are found by
///   trying every `check_interval` (0.25 s × 0.5–1.5, portalocker's rate).
/// - **A lost subscription is a lost lock**, reported at once through the loss watcher: the
///   connection closed or was killed (`CLIENT KILL`, as portalocker's waiters do to holders
///   that do not answer for `unavailable_timeout`), its health check (a `PING` every
///   `health_check_interval`, 10 s) got no answer in the response timeout, or its self-checks
///   (a message from the command connection to the subscription every `unavailable_timeout /
///   4`) stopped coming back for `unavailable_timeout` less a tenth: the lease a prober grants
///   it ([`lease_remaining`](Store::lease_remaining)), which ends before any prober with the
///   same `unavailable_timeout` can reap it. Every process on a lock must use the same
///   `unavailable_timeout` (portalocker's default is ours): a prober with a shorter one reaps
///   sooner than the holder's lease assumes. A prober that finds replies missing at its
///   deadline reads what its connection already received before it reaps, and reaps nobody
///   when it was itself late. The subscription is never made again behind the holder's back.
/// - **Fencing**: each exclusive acquisition draws `INCR <channel>-fence` (portalocker's fence
///   key), a reader reads it; a missing counter (Redis restarted empty) is seeded from the
///   server's clock, so tokens keep increasing.
/// - **Promotion keeps the read lock until the write lock is confirmed**: the reader subscribes
///   a second time as a writer (another id) and lets its reader go only once the writer is
///   confirmed; a refused or cancelled promotion still reads. Demotion is one local change of
///   the advertised mode.
/// - **Introspection**: [`holders`](Store::holders) pings the channel without subscribing to it
///   and never reaps: each holder's mode, its 32-hex id and the fencing counter as it stands
///   (the writer's token, or the readers').
///
/// # Guarantees and limits
///
/// The protocol's, no more: exclusion holds while every participant answers pings within the
/// prober's `unavailable_timeout`. A holder that stops answering (paused, wedged) is killed and
/// its lock taken over **while its code may still be running**: use the fencing token where
/// that matters. A subscriber on the channel that is not a lock holder (a `redis-cli
/// SUBSCRIBE`) makes every attempt inconclusive; it is never killed, and the error says so.
/// Standalone Redis only (`PUBSUB NUMSUB` is per node in a cluster); channels ignore database
/// numbers; `CLIENT LIST`, `CLIENT KILL`, `MULTI`/`EXEC`, `EVAL` and `EVALSHA` must be allowed. Nothing
/// expires: ttls are ignored.
/// Keys hold a connection and refuse to serialize.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::{LockFactory, Lockable as _, RedisPubSubStore};
///
/// let store = RedisPubSubStore::from_dsn("redis+pubsub://127.0.0.1:6379")?;
/// let factory = LockFactory::new(store);
/// let lock = factory.create_lock("nightly-report");
/// if lock.try_acquire().await? {
///     // ... the work; the lock goes the moment this process dies ...
///     let _ = lock.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisPubSubStore {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    config: PubSubConfig,
    conns: Arc<Conns>,
    timing: Timing,
    owner: HandleOwner,
    /// Gates per channel and mode: of this store's waiters on a resource in one mode, only the
    /// one through the gate attempts (the others wait at the gate, in order), so a hundred local
    /// waiters are one or two contenders on the wire, not a hundred subscriptions coming and
    /// going that keep every probe inconclusive.
    gates: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

/// What a holder keeps on its key.
#[derive(Default)]
struct Handle {
    held: Mutex<Option<Held>>,
}

struct Held {
    sub: Sub,
    mode: Mode,
    token: u64,
}

impl Handle {
    fn current(&self) -> Option<(Arc<Shared>, Mode, u64)> {
        lock(&self.held)
            .as_ref()
            .map(|h| (h.sub.shared.clone(), h.mode, h.token))
    }
}

impl RedisPubSubStore {
    /// A store from a DSN: `redis+pubsub://[user:password@]host[:port][/db]`,
    /// `rediss+pubsub://…` (TLS), `unix+pubsub:///path`, with the Redis store's options
    /// (`prefix`, `socket_timeout`, `socket_connect_timeout`) and the protocol's:
    /// `unavailable_timeout` (1 s: how long a ping is answered in before a silent participant
    /// is reaped), `check_interval` (0.25 s: a waiter's base pause), `health_check_interval`
    /// (10 s). Connects lazily.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming what is wrong
    /// (never a credential).
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        let config = config::parse(dsn)?;
        let conns = Arc::new(Conns::new(&config)?);
        Ok(RedisPubSubStore {
            inner: Arc::new(Inner {
                timing: Timing {
                    unavailable: config.unavailable,
                    health_check: config.health_check,
                },
                config,
                conns,
                owner: HandleOwner::new(),
                gates: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The lock channel of `resource`: the prefix and the resource.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) unless it is printable
    /// ASCII without spaces (Redis refuses anything else in the connection's name).
    pub fn channel(&self, resource: &str) -> Result<String> {
        let channel = format!("{}{resource}", self.inner.config.redis.prefix);
        match decide::invalid_channel(&channel) {
            None => Ok(channel),
            Some(why) => Err(Error::invalid_argument(format!(
                "cannot lock this resource on the pub/sub store: its channel name is invalid: {why}"
            ))
            .with_resource(resource)
            .with_store(self)),
        }
    }

    /// The name of the connection that holds `key`'s lock, while it holds (`CLIENT LIST`
    /// shows it).
    pub fn connection_name(&self, key: &Key) -> Option<String> {
        let handle = key.existing_handle::<Handle>(self.inner.owner)?;
        let (shared, _, _) = handle.current()?;
        Some(decide::connection_name(&shared.channel, &shared.id))
    }

    /// Makes `key`'s holder stop answering pings, as a wedged process would: a test hook for
    /// reaping (its lock is then taken over by the next waiter, which kills its connection).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn stop_answering(&self, key: &Key) {
        if let Some(handle) = key.existing_handle::<Handle>(self.inner.owner)
            && let Some((shared, _, _)) = handle.current()
        {
            shared.mute();
        }
    }

    /// The holder's two ids: the first for a fresh acquisition (its first 12 digits are
    /// [`Key::holder_id`]), the second for the writer a reader promotes with.
    fn ids(key: &Key) -> (String, String) {
        use sha2::{Digest, Sha256};
        let token = key.token(KIND);
        let hex =
            |bytes: &[u8]| -> String { bytes[..16].iter().map(|b| format!("{b:02x}")).collect() };
        let first = hex(&Sha256::digest(token.as_bytes()));
        let second = hex(&Sha256::digest(format!("promotion\n{token}").as_bytes()));
        (first, second)
    }
}

impl RedisPubSubStore {
    fn holding(&self, key: &Key) -> Holding {
        let Some(handle) = key.existing_handle::<Handle>(self.inner.owner) else {
            return Holding::NotHeld(LostReason::Removed);
        };
        match handle.current() {
            Some((shared, mode, _)) if shared.life() == Life::Live => Holding::Held(mode),
            Some(_) => Holding::NotHeld(LostReason::Disconnected),
            None => Holding::NotHeld(LostReason::Removed),
        }
    }
}

impl fmt::Display for RedisPubSubStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.config.redis.shown)
    }
}

impl fmt::Debug for RedisPubSubStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisPubSubStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for RedisPubSubStore {
    fn why_not_counting(&self) -> String {
        "its protocol (shared with portalocker's pub/sub lock) has one writer or readers per \
         channel and no count; use the redis store's semaphores"
            .to_owned()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: true,
            shared: true,
            blocking: true,
            blocking_shared: true,
            expiring: false,
            fencing: true,
            notifies: false,
            serializable_keys: false,
            introspection: true,
            liveness: true,
            observes_loss: true,
            leased: true,
            counting: false,
            metadata: false,
            lists: false,
            fair: false,
        }
    }

    /// `PUBSUB CHANNELS` can name channels with subscribers, but every one at once (no cursor)
    /// and an application's alike, and only pinging a channel tells a lock from a stranger's
    /// channel: no bounded, harmless listing. Metadata has no place either: the protocol writes
    /// no key, and portalocker reads the connection names.
    fn why_not_listing(&self) -> String {
        "pub/sub locks are subscriptions, which Redis enumerates only all at once with          everybody's channels (PUBSUB CHANNELS), never by lock"
            .to_owned()
    }

    /// One attempt, as portalocker's `fail_when_locked` with no timeout: subscribe, count,
    /// probe, decide, confirm. A probe left inconclusive (somebody came or went, or stayed
    /// silent and was reaped) is a refusal.
    async fn save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.write(key, true).await
    }

    /// One reader's attempt.
    async fn save_read(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.read(key, true).await
    }

    /// Attempts until the write lock is held: at once after a release by this library,
    /// otherwise every `check_interval` (jittered). Elected behind readers, it keeps its
    /// subscription (advertising the election, which blocks new readers).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting, its subscription closes (an election goes with it)
    /// and a reader promoting keeps its read lock.
    async fn wait_and_save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.write(key, false).await
    }

    /// Attempts until a read lock is held, as [`wait_and_save`](Self::wait_and_save).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting, its subscription closes.
    async fn wait_and_save_read(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.read(key, false).await
    }

    /// Whether the holder's subscription is still live (nothing expires).
    async fn put_off_expiration(&self, key: &Key, _ttl: Duration) -> Result<Holding> {
        Ok(self.holding(key))
    }

    /// Unsubscribes (confirmed), closes the connection and wakes this library's waiters.
    /// `false` when the subscription was already gone.
    async fn delete(&self, key: &Key) -> Result<bool> {
        let Some(handle) = key.existing_handle::<Handle>(self.inner.owner) else {
            return Ok(false);
        };
        let Some(held) = lock(&handle.held).take() else {
            return Ok(false);
        };
        Ok(held.sub.close().await)
    }

    /// Whether the holder's subscription is still live.
    async fn exists(&self, key: &Key) -> Result<Holding> {
        Ok(self.holding(key))
    }

    /// Completes when the holder's subscription ends: [`LostReason::Disconnected`] when it
    /// went without its holder (closed, killed, its health check unanswered), at once.
    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        let Some(handle) = key.existing_handle::<Handle>(self.inner.owner) else {
            return Ok(None);
        };
        // Weak: the watcher must not keep the holder's connection open after the key goes.
        let handle = Arc::downgrade(&handle);
        Ok(Some(LossWatcher::new(async move {
            loop {
                let Some((shared, _, _)) = handle.upgrade().and_then(|h| h.current()) else {
                    return LostReason::Removed;
                };
                let life = shared.ended().await;
                let now = handle.upgrade().and_then(|h| h.current());
                match now {
                    // A promotion swapped the subscription: watch the new one.
                    Some((next, _, _)) if !Arc::ptr_eq(&next, &shared) => continue,
                    _ if life == Life::Lost => return LostReason::Disconnected,
                    _ => return LostReason::Removed,
                }
            }
        })))
    }

    /// Pings the channel without subscribing to it, until every subscriber answered (up to
    /// twice `unavailable_timeout`); never reaps. Then `GET <channel>-fence` where anybody
    /// holds.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let channel = self.channel(resource)?;
        let records = probe::read_only(
            &self.inner.conns,
            self.inner.timing,
            &channel,
            self.inner.timing.unavailable * 2,
        )
        .await
        .map_err(|e| e.with_resource(resource).with_store(self))?;
        let mut holders: Vec<HolderInfo> = records
            .into_iter()
            .filter_map(|r| {
                let mode = match r.mode {
                    Wire::Shared => Mode::Read,
                    Wire::Exclusive => Mode::Write,
                    Wire::Pending => return None,
                };
                let mut info = HolderInfo::new(mode, None, None);
                info.id = Some(r.holder_id);
                Some(info)
            })
            .collect();
        // The holders' fencing token is the counter as it stands: a writer draws it after its
        // confirmation, while it alone holds (readers read it and share it), so the last draw
        // is the current writer's (until the moment between a new writer's confirmation and
        // its draw, when the previous token shows).
        if !holders.is_empty()
            && let Some(token) = self.fencing_counter(resource).await?.filter(|t| *t > 0)
        {
            for holder in &mut holders {
                holder.fencing_token = Some(token);
            }
        }
        Ok(holders)
    }

    /// `GET <channel>-fence`.
    async fn fencing_counter(&self, resource: &str) -> Result<Option<u64>> {
        let channel = self.channel(resource)?;
        let mut conn = self
            .inner
            .conns
            .command()
            .await
            .map_err(|e| e.with_resource(resource).with_store(self))?;
        let value: Option<String> = redis::cmd("GET")
            .arg(format!("{channel}-fence"))
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_error("cannot read the fencing counter", &e))
            .map_err(|e| e.with_resource(resource).with_store(self))?;
        Ok(Some(value.and_then(|v| v.parse().ok()).unwrap_or(0)))
    }

    /// How long the holder's lock certainly lasts from now if this process goes silent now:
    /// from the send time of its last self-check that came back, `unavailable_timeout` less a
    /// tenth (a prober with the same `unavailable_timeout` kills a holder that leaves its ping
    /// unanswered that long). A self-check still in flight never extends it. The holder gives
    /// its lock up as lost when it runs out.
    fn lease_remaining(&self, key: &Key) -> Option<Duration> {
        let handle = key.existing_handle::<Handle>(self.inner.owner)?;
        let (shared, _, _) = handle.current()?;
        shared.lease_remaining()
    }

    /// Closes the command connection and the listener (holders' subscriptions stay theirs).
    async fn close(&self) -> Result<()> {
        self.inner.conns.close().await;
        Ok(())
    }

    /// The server (channels ignore database numbers) and the prefix.
    fn locks_in(&self) -> Option<String> {
        let shown = &self.inner.config.redis.shown;
        let server = match shown.split_once("://") {
            Some((scheme, rest)) if scheme.starts_with("unix") => {
                format!("{scheme}://{}", rest.split('?').next().unwrap_or(rest))
            }
            Some((scheme, rest)) => {
                format!("{scheme}://{}", rest.split('/').next().unwrap_or(rest))
            }
            None => shown.clone(),
        };
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        q.append_pair("prefix", &self.inner.config.redis.prefix);
        Some(format!("{server}?{}", q.finish()))
    }

    /// The lock channel and the server.
    fn location(&self, resource: &str) -> Option<String> {
        let channel = self.channel(resource).ok()?;
        Some(format!(
            "channel {channel:?} on {}",
            self.inner.config.redis.shown
        ))
    }
}
