//! [`RedisStore`]: locks in Redis or Valkey, in the layout shared with Python xtr-lock 4.1.0 and
//! Symfony Lock, one round trip per operation, woken on release, fenced.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::{
    Capabilities, HolderInfo, Holding, Listing, LossWatcher, LostReason, Saved, Store, Watcher,
    check_expiry,
};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};

mod check;
mod config;
mod conn;
mod failover;
mod grant;
mod layout;
mod leaving;
mod listing;
mod notify;
mod observers;
mod observing;
mod prelude;
mod queue;
mod save;
mod scripts;
mod semaphore;
mod semaphore_scripts;
mod servers;
mod sharded;
mod shards;
mod topology;

/// Checks a Redis DSN without building anything.
pub(crate) fn validate_dsn(dsn: &str) -> Result<()> {
    config::parse(dsn).map(|_| ())
}
use crate::mutex::lock;
pub(crate) use config::{RedisConfig, ignore_pool_options, read as read_config};
use conn::ConnectFailure;
use conn::{Call, Keys};
pub(crate) use conn::{NOT_REDIS, speaks_another_protocol};
use layout::Layout;
use notify::Notifier;
use scripts::Scripts;
use semaphore_scripts::SemScripts;
use servers::{Conn, Servers};
use topology::{Durability, Topology};

/// The token kind of Redis stores: one token per key for every Redis store (a quorum over
/// several servers sees one holder).
const KIND: &str = "redis";

/// The time probe's key (see [`RedisStore::internal_key`]).
const PROBE_KEY: &str = "probe";

/// The fencing counter: one per prefix, shared by every resource (strictly increasing for each).
const FENCE_KEY: &str = "fence";

/// Locks in Redis (or Valkey): one sorted set per resource, shared with Python xtr-lock 4.1.0's
/// and Symfony Lock's `RedisStore`, so Rust, Python and PHP processes exclude each other.
///
/// - **One round trip** per acquire (the ttl goes into the save), refresh and release (the
///   release script says what it removed). The peers need two for acquire and release.
/// - **Woken on release**: releases publish on a channel from inside the release script; waiters
///   of this store share one subscriber connection, and a release wakes **one** of them (a
///   reader that gets in wakes the next). A waiter also sleeps only until the earliest
///   current lease ends (the refusal says when), so a crashed holder's lock is taken the moment
///   it expires. Releases by Python or PHP peers publish nothing, so a 90–110 ms poll remains.
/// - **Fencing tokens** from a counter in a separate key that no resource can name
///   (`<prefix>` + byte `0xFF` + `xtr-lock:fence`), advanced atomically with each new exclusive
///   acquisition; a missing counter is seeded from the server's clock in microseconds, so
///   tokens keep increasing after a restart that lost the counter. Readers get the counter as
///   it stands. Peers neither read nor touch
///   it; their acquisitions do not advance it, so fence only among processes of this library.
/// - `exists` / [`is_acquired`](crate::Lockable::is_acquired) is **read-only** (a `no-writes` script
///   on Redis ≥ 7), so it works on replicas and with read-only ACLs.
/// - An expired reader cannot revive itself with a refresh; its entry is removed instead.
/// - **Counting semaphores** in Symfony Semaphore 5.4's layout (`{r}:time`, `{r}:weight`),
///   counted together with PHP holders, woken and served first come first served like locks
///   (`docs/semaphores.md`).
///
/// # Guarantees
///
/// Excludes everyone using this layout on the same server and key: other processes, other
/// machines, Python and PHP peers. A lock outlives a crashed holder only until its ttl.
///
/// # Failure modes
///
/// - An unreachable or silent server gives a storage error (marked temporary) within the
///   socket timeouts (5 s by default), never a hang.
/// - Without `WAIT`, a failover to a replica that had not received the lock loses it; use a
///   quorum of independent servers where that matters.
/// - A string at the key is read as someone else's lock (conflict); any other type is a storage
///   error naming the resource.
/// - A lock needs a ttl: an acquire without one is refused (there is no silent 300 s).
///
/// # Clock assumptions
///
/// Scores are in milliseconds on the **server's** clock (`TIME`), so clients' clocks do not
/// matter. Servers that refuse `TIME` in scripts get the client's wall clock instead, as the
/// peers do, and then every client's clock must be right. The local deadline is measured on the
/// key's monotonic clock from before the round trip, so it is never later than the server's.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use std::time::Duration;
/// use xtr_lock::{LockFactory, Lockable as _, RedisStore};
///
/// let store = RedisStore::from_dsn("redis://localhost:6379/0?prefix=app:")?;
/// let lock = LockFactory::new(store).create_lock("invoice:42").with_ttl(Duration::from_secs(30));
/// if lock.try_acquire().await? {
///     println!("fencing token {:?}", lock.fencing_token());
///     let _ = lock.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    shown: String,
    prefix: String,
    /// One server, a cluster, or Sentinel's master (shared by stores `with_prefix` makes).
    servers: Arc<Servers>,
    /// Where the store's own keys go (beside their resources' keys on a cluster).
    layout: Layout,
    /// Replicas that must confirm each save (`wait_replicas`).
    durability: Option<Durability>,
    /// Waiters go first in arrival order (else newcomers may barge: `fair=false`).
    fair: bool,
    connect_timeout: Option<Duration>,
    response_timeout: Option<Duration>,
    /// Opened on first use; replaced when its driver task is gone (see `eval`).
    /// With the count of Sentinel's master changes when it was opened (`conn.rs`).
    conn: std::sync::Mutex<Option<(Conn, u64)>>,
    /// The connection attempt under way (one at a time, shared by the requests that wait).
    connecting: std::sync::Mutex<
        Option<futures_util::future::Shared<crate::clock::BoxFuture<'static, ()>>>,
    >,
    /// Built once per process (the preludes and digests cost about as much as the rest of a
    /// CLI run's start-up), the semaphore's only when first used.
    scripts: &'static Scripts,
    sem: &'static LazyLock<SemScripts>,
    /// `Some(true)`: the client's clock (the server refused); `Some(false)`: the server's.
    client_clock: std::sync::Mutex<Option<bool>>,
    /// The last failed connection attempt.
    failed: std::sync::Mutex<Option<ConnectFailure>>,
    /// The server does not know script flags (Redis < 7): use the plain `exists` script.
    legacy_exists: AtomicBool,
    notifier: Notifier,
}

static SEM_SCRIPTS: LazyLock<SemScripts> = LazyLock::new(SemScripts::new);

impl RedisStore {
    /// A store on the server `dsn` names: `redis://[user[:password]@]host[:port][/db]`,
    /// `rediss://…` (TLS), `valkey://`, `valkeys://`, `unix:///path/to/socket[?db=N]`, with the
    /// options `prefix`, `db`, `socket_timeout` and `socket_connect_timeout` (seconds, default 5).
    /// Touches no network: the connection opens on first use.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a malformed DSN,
    /// showing its scheme only.
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        let config = config::parse(dsn)?;
        let servers = Servers::new(
            &config.topology,
            &config.client_url,
            Some(config.connect_timeout),
            Some(config.response_timeout),
        )
        .map_err(|e| Error::invalid_argument("invalid Redis connection string").with_source(e))?;
        Self::build(
            Arc::new(servers),
            &config,
            Some(config.connect_timeout),
            Some(config.response_timeout),
        )
    }

    /// A store over a client you built, with no prefix and no timeouts of ours (the client's
    /// connection settings apply).
    pub fn from_client(client: redis::Client) -> Self {
        let shown = describe(client.get_connection_info());
        let config = RedisConfig {
            client_url: String::new(),
            shown,
            prefix: String::new(),
            connect_timeout: config::DEFAULT_TIMEOUT,
            response_timeout: config::DEFAULT_TIMEOUT,
            topology: Topology::Single,
            durability: None,
            fair: true,
        };
        Self::build(Arc::new(Servers::Single(client)), &config, None, None)
            .expect("one server takes any prefix")
    }

    fn build(
        servers: Arc<Servers>,
        config: &RedisConfig,
        connect_timeout: Option<Duration>,
        response_timeout: Option<Duration>,
    ) -> Result<Self> {
        let layout = if servers.is_cluster() {
            Layout::slotted(&config.prefix)?
        } else {
            Layout::plain(&config.prefix)
        };
        let notifier = Notifier::new(
            servers.clone(),
            connect_timeout.unwrap_or(config::DEFAULT_TIMEOUT),
            layout.is_slotted(),
        );
        Ok(RedisStore {
            inner: Arc::new(Inner {
                shown: config.shown.clone(),
                prefix: config.prefix.clone(),
                servers,
                layout,
                durability: config.durability,
                fair: config.fair,
                connect_timeout,
                response_timeout,
                conn: std::sync::Mutex::new(None),
                connecting: std::sync::Mutex::new(None),
                scripts: &scripts::SCRIPTS,
                sem: &SEM_SCRIPTS,
                client_clock: std::sync::Mutex::new(None),
                failed: std::sync::Mutex::new(None),
                legacy_exists: AtomicBool::new(false),
                notifier,
            }),
        })
    }

    /// The same server with another key prefix (`"app:locks:"`). Keys are prefix + resource,
    /// verbatim; to share locks with Symfony, the prefix must be empty or equal phpredis's
    /// `OPT_PREFIX`.
    ///
    /// # Panics
    ///
    /// On a Redis Cluster, when the prefix's first braces are empty (`"{}"`): Redis then hashes
    /// whole keys, and the store's own keys cannot follow their resources' slots.
    pub fn with_prefix(&self, prefix: impl Into<String>) -> Self {
        let config = RedisConfig {
            client_url: String::new(),
            shown: self.inner.shown.clone(),
            prefix: prefix.into(),
            connect_timeout: config::DEFAULT_TIMEOUT,
            response_timeout: config::DEFAULT_TIMEOUT,
            topology: Topology::Single,
            durability: self.inner.durability,
            fair: self.inner.fair,
        };
        Self::build(
            self.inner.servers.clone(),
            &config,
            self.inner.connect_timeout,
            self.inner.response_timeout,
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Uses the client's wall clock for scores from now on, as the probe does when the server
    /// refuses `TIME` in scripts. For tests of that mode; production stores let the probe decide.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn force_client_clock(self) -> Self {
        *lock(&self.inner.client_clock) = Some(true);
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key of `resource`: prefix + resource.
    pub fn key_for(&self, resource: &str) -> String {
        format!("{}{resource}", self.inner.prefix)
    }

    /// The key of the store's own data that belongs with no resource (the clock probe's
    /// scratch key; on one server also the fencing counter, `internal_key("fence")`):
    /// `<prefix>`, the byte `0xFF`, `xtr-lock:` and `name`. A lock key is the prefix and a
    /// resource, both UTF-8, and UTF-8 never contains `0xFF`, so no resource can name these
    /// keys. ACL key patterns that cover `<prefix>*` cover them. On a Redis Cluster the keys
    /// that belong with a resource (its fencing counter, wait queue, holder records) carry a
    /// hash tag after `xtr-lock:` that puts them in the resource's slot (see `layout.rs`).
    pub fn internal_key(&self, name: &str) -> Vec<u8> {
        self.inner.layout.loose(name)
    }
}

impl Drop for Inner {
    /// Ends the store's subscriber connections and their reader tasks (they hold the waiters'
    /// state, not the store, so nothing else would end them).
    fn drop(&mut self) {
        self.notifier.close();
    }
}

impl RedisStore {
    /// Runs a read-only script (`no-writes`), or its body without the flag on servers that do
    /// not know script flags (Redis < 7; remembered).
    async fn read_only_script(
        &self,
        script: &redis::Script,
        legacy: &redis::Script,
        key: &Key,
        call: impl Fn() -> Call<'static>,
    ) -> Result<i64> {
        if !self.inner.legacy_exists.load(Ordering::Relaxed) {
            match self.eval_call::<i64>(script, key, None, call()).await {
                Ok(code) => return Ok(code),
                Err(e) if e.to_string().contains("shebang") || e.to_string().contains("flag") => {
                    self.inner.legacy_exists.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        self.eval_call(legacy, key, None, call()).await
    }
}

/// What a holding code of the scripts means.
fn holding(code: i64) -> Holding {
    match code {
        2 => Holding::Held(Mode::Write),
        1 => Holding::Held(Mode::Read),
        -1 => Holding::NotHeld(LostReason::Expired),
        -2 => Holding::NotHeld(LostReason::TakenOver),
        _ => Holding::NotHeld(LostReason::Removed),
    }
}

/// A credential-free description of a client's server.
fn describe(info: &redis::ConnectionInfo) -> String {
    let db = info.redis_settings().db();
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => format!("redis://{host}:{port}/{db}"),
        redis::ConnectionAddr::TcpTls { host, port, .. } => format!("rediss://{host}:{port}/{db}"),
        redis::ConnectionAddr::Unix(path) => format!("unix://{}?db={db}", path.display()),
        _ => "redis".to_owned(),
    }
}

impl fmt::Display for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.shown)
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("server", &self.inner.shown)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for RedisStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: true,
            shared: true,
            blocking: false,
            blocking_shared: false,
            expiring: true,
            fencing: true,
            notifies: true,
            serializable_keys: true,
            introspection: true,
            liveness: false,
            observes_loss: false,
            leased: false,
            counting: true,
            metadata: true,
            lists: true,
            fair: self.inner.fair,
        }
    }

    /// The server as addressed, the database and the prefix, as a DSN without credentials
    /// (`redis://host:6379/0?prefix=app%3A`) that reaches the same locks.
    fn locks_in(&self) -> Option<String> {
        let shown = &self.inner.shown;
        if self.inner.prefix.is_empty() {
            return Some(shown.clone());
        }
        let prefix: String =
            url::form_urlencoded::byte_serialize(self.inner.prefix.as_bytes()).collect();
        let glue = if shown.contains('?') { '&' } else { '?' };
        Some(format!("{shown}{glue}prefix={prefix}"))
    }

    /// The key's name and the server: `key "app:r" in redis://host:6379/0`.
    fn location(&self, resource: &str) -> Option<String> {
        Some(format!(
            "key {:?} in {}",
            self.key_for(resource),
            self.inner.shown
        ))
    }

    /// One round trip: prune, admit (new writer on an empty set, re-save, or the sole reader's
    /// promotion), write now + ttl, advance the fence for a new writer.
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        if let Some(permits) = key.permits() {
            return self.semaphore_save(key, permits, ttl).await;
        }
        self.save_mode(key, ttl, Mode::Write).await
    }

    /// One round trip: prune, join readers or demote the caller's write lock.
    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        if key.permits().is_some() {
            return Err(semaphore::no_shared_permits(self, key));
        }
        self.save_mode(key, ttl, Mode::Read).await
    }

    /// One round trip; refuses (and removes) an entry whose lease already ended.
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        if key.permits().is_some() {
            return self.semaphore_put_off(key, ttl).await;
        }
        self.settled(key).await;
        key.reduce_lifetime(ttl);
        let call = self.call_for(key, Keys::Lock, None);
        let (code, confirmed): (i64, bool) = self
            .eval_durable(&self.inner.scripts.put_off, key, Some(ttl), call)
            .await?;
        let held = holding(code);
        if held.is_held() {
            if !confirmed {
                return Err(self.unconfirmed(key));
            }
            check_expiry(self, key).await?;
        }
        Ok(held)
    }

    /// One round trip: the holder's entry (a reader's or a writer's, and its record) now ends
    /// `after` from the server's now (shortened or lengthened, in ms rounded up), and every
    /// queued waiter is woken to learn when. Nothing of the holder is kept in this process.
    /// A semaphore's holder's lease is put off (whole seconds, rounded up).
    async fn release_after(&self, key: &Key, after: Duration) -> Result<Option<Holding>> {
        if key.permits().is_some() {
            return self.semaphore_put_off(key, after).await.map(Some);
        }
        self.settled(key).await;
        let scripts = &self.inner.scripts;
        let code: i64 = self
            .eval(&scripts.release_after, key, Some(after), Keys::Queue, None)
            .await?;
        Ok(Some(holding(code)))
    }

    /// One round trip; `true` only if a live lease was removed (an ended one counts as lost).
    async fn delete(&self, key: &Key) -> Result<bool> {
        if key.permits().is_some() {
            return self.semaphore_delete(key).await;
        }
        self.settled(key).await;
        let removed: i64 = self
            .eval(&self.inner.scripts.delete, key, None, Keys::Queue, None)
            .await?;
        Ok(removed == 1)
    }

    /// Read-only: the token's score is later than the server's now; the write marker beside
    /// it makes it a writer.
    async fn exists(&self, key: &Key) -> Result<Holding> {
        if key.permits().is_some() {
            return self.semaphore_exists(key).await;
        }
        self.settled(key).await;
        let scripts = &self.inner.scripts;
        let code = self
            .read_only_script(&scripts.exists, &scripts.exists_legacy, key, || Call {
                keys: self.script_keys(key, Keys::ReadOnly),
                read_only: true,
                ticket: None,
                extra: Vec::new(),
            })
            .await?;
        Ok(holding(code))
    }

    /// Permits held, the stored limit and the holders, from Symfony's two sets.
    async fn usage(&self, key: &Key) -> Result<super::Usage> {
        self.semaphore_usage(key).await
    }

    /// Registers the holder as a waiter: its next refused save queues it on the server (in the
    /// order of `waiting_since`), and a release wakes it (one waiter per release across every
    /// process; every waiting reader when readers can come in). Subscribes the store's wake
    /// channel on first use. The watcher sees every release while every holder it waits behind
    /// announces its release (this library's holders); beside a Python or PHP holder the lock
    /// polls.
    async fn watch(&self, key: &Key, waiting_since: SystemTime) -> Result<Option<Watcher>> {
        if key.permits().is_some() {
            return self.semaphore_watch(key, waiting_since).await;
        }
        let lock_key = self.key_for(key.resource());
        Ok(self
            .inner
            .notifier
            .watch(self, lock_key, key, waiting_since)
            .await)
    }

    /// On Sentinel: completes when a fail-over's new master does not have the lock (looked
    /// for after each `+switch-master`, and whenever the old master stopped answering as one).
    /// Elsewhere `None`: holders find a lost lock when they renew.
    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        Ok(self.failover_watcher(key))
    }

    /// Drops the command connection and the subscriber connection (waiters wake and poll, then
    /// re-subscribe on a new one). Requests still under way finish on the old connection first;
    /// the next request opens a new one. Never fails.
    async fn close(&self) -> Result<()> {
        lock(&self.inner.conn).take();
        self.inner.notifier.close();
        Ok(())
    }

    /// `GET` of the fencing counter (one per prefix; one per hash slot on a cluster).
    async fn fencing_counter(&self, resource: &str) -> Result<Option<u64>> {
        let mut conn = self.conn().await.map_err(|e| e.with_resource(resource))?;
        let value: Option<u64> = self
            .read(
                redis::cmd("GET")
                    .arg(self.fence_key(&self.key_for(resource)))
                    .query_async(&mut conn),
            )
            .await
            .map_err(|e| self.redis_error(e, Some(resource)))?;
        Ok(Some(value.unwrap_or(0)))
    }

    /// The holders of `resource` and their remaining leases, from the sorted set.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let mut conn = self.conn().await.map_err(|e| e.with_resource(resource))?;
        let key = self.key_for(resource);
        let kind: String = self
            .read(redis::cmd("TYPE").arg(&key).query_async(&mut conn))
            .await
            .map_err(|e| self.redis_error(e, Some(resource)))?;
        match kind.as_str() {
            "none" => return Ok(Vec::new()),
            // Someone else's lock in another format (a SET NX lock): held, nothing more known.
            "string" => return Ok(vec![HolderInfo::new(Mode::Write, None, None)]),
            "zset" => {}
            other => {
                return Err(Error::storage(format!(
                    "the Redis key of this lock holds a {other}, not a lock"
                ))
                .with_resource(resource)
                .with_store(self));
            }
        }
        self.zset_holders(&mut conn, resource).await
    }

    /// `SCAN` (`MATCH` on the prefix, glob characters escaped; `COUNT` bounded) over the store's
    /// keys: every sorted set that is a lock (members are tokens and the write marker only:
    /// ours, Python's and Symfony's alike) and every Symfony-layout semaphore, each with its
    /// live holders and our holders' records; never our internal keys, never a key whose
    /// holders' leases all ended. A round trip or two per key listed.
    async fn list(&self, prefix: &str) -> Result<Vec<Listing>> {
        self.list_held(prefix).await
    }

    /// Polls who holds `resource` (every 100 ms, a read of the set) and wakes when that
    /// changed: a best-effort watcher that registers no waiter (see `listing.rs`).
    async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
        self.observe(resource).await
    }

    async fn check(&self) -> Result<Vec<super::StoreWarning>> {
        self.check_server().await
    }
}
