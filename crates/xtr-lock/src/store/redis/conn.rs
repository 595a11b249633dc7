//! The command connection of a Redis store: opened on first use, one attempt at a time within
//! the connect timeout, its failure shared; the clock probe; running a script for a key.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::FutureExt as _;
use redis::aio::ConnectionManagerConfig;

use super::servers::Conn;
use super::{KIND, PROBE_KEY, RedisStore, lock};
use crate::clock::BoxFuture;
use crate::error::{Error, Result};
use crate::key::Key;

/// After a failed connection attempt, requests fail at once with its error for this long
/// instead of starting another attempt.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// A failed connection attempt, shared with the requests that waited for it.
pub(super) struct ConnectFailure {
    at: Instant,
    /// Counts failed attempts, so a waiting request can tell that one ended while it waited.
    seq: u64,
    reason: String,
    temporary: bool,
}

impl ConnectFailure {
    fn error(&self, store: &RedisStore) -> Error {
        let err = Error::storage(self.reason.clone()).with_store(store);
        if self.temporary { err.temporary() } else { err }
    }
}

/// Error texts by which a server refuses `TIME` followed by a write in a script.
const CLOCK_REFUSALS: &[&str] = &[
    "commands not allowed after non deterministic",
    "is not allowed from script",
];

impl RedisStore {
    fn cached_conn(&self) -> Option<Conn> {
        let mut cached = lock(&self.inner.conn);
        match &*cached {
            Some((conn, epoch)) if *epoch == self.master_epoch() => Some(conn.clone()),
            // Opened to a master Sentinel has since replaced (seen by this store or a sibling
            // sharing its servers): never used again.
            Some(_) => {
                *cached = None;
                None
            }
            None => None,
        }
    }

    /// The command connection, opened on first use. One attempt at a time, in a task of its
    /// own: every request waiting for it shares its outcome, and it goes on whether or not the
    /// request that started it is still polled (a quorum leaves a member's request unpolled
    /// while it takes back what other members stored; it must never hold up the others).
    pub(super) async fn conn(&self) -> Result<Conn> {
        if let Some(conn) = self.cached_conn() {
            return Ok(conn);
        }
        let inner = &self.inner;
        let seen = {
            let failed = lock(&inner.failed);
            match &*failed {
                // Just failed: do not knock again at once (a quorum's next request to a dead
                // member, a waiter's retry); say why the last attempt failed.
                Some(f) if f.at.elapsed() < RECONNECT_PAUSE => return Err(f.error(self)),
                Some(f) => f.seq,
                None => 0,
            }
        };
        let attempt = {
            let mut connecting = lock(&inner.connecting);
            if let Some(conn) = self.cached_conn() {
                return Ok(conn);
            }
            match &*connecting {
                // (One that ended without clearing the slot died with its runtime.)
                Some(under_way) if under_way.peek().is_none() => under_way.clone(),
                _ => {
                    let store = self.clone();
                    let task = tokio::spawn(async move { store.connect().await });
                    let under_way: BoxFuture<'static, ()> = Box::pin(async move {
                        let _ = task.await;
                    });
                    let under_way = under_way.shared();
                    *connecting = Some(under_way.clone());
                    under_way
                }
            }
        };
        attempt.await;
        if let Some(conn) = self.cached_conn() {
            return Ok(conn);
        }
        match lock(&inner.failed).as_ref() {
            Some(f) if f.seq != seen => Err(f.error(self)),
            _ => Err(Error::storage("cannot connect to the Redis server")
                .with_store(self)
                .temporary()),
        }
    }

    /// One connection attempt (the task `conn` shares): the connection, or the failure, is left
    /// in the store for the requests that wait.
    async fn connect(&self) {
        let inner = &self.inner;
        let cfg = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(inner.connect_timeout)
            // A script's caller waits the response timeout (`eval`); the request itself may
            // take up to the landing bound longer before the connection gives up on it.
            .set_response_timeout(
                inner
                    .response_timeout
                    .map(|t| t * (1 + crate::serial::LANDING)),
            );
        let connecting = inner.servers.connect(cfg);
        // The manager retries a refused connection once on its own; the whole attempt stays
        // within the connect timeout the DSN gives.
        let bound = inner.connect_timeout.unwrap_or(Duration::from_secs(30));
        let outcome = match tokio::time::timeout(bound, connecting).await {
            Ok(result) => result.map_err(|e| self.redis_error(e, None)),
            Err(_) => Err(
                Error::storage("cannot connect to the Redis server: timed out")
                    .with_store(self)
                    .temporary(),
            ),
        };
        match outcome {
            Ok(conn) => *lock(&inner.conn) = Some((conn, self.master_epoch())),
            Err(err) => {
                let mut failed = lock(&inner.failed);
                let seq = failed.as_ref().map_or(0, |f| f.seq) + 1;
                *failed = Some(ConnectFailure {
                    at: Instant::now(),
                    seq,
                    reason: err.reason().unwrap_or("cannot connect").to_owned(),
                    temporary: err.is_temporary(),
                });
            }
        }
        *lock(&inner.connecting) = None;
    }

    /// A read that changes nothing, bounded by the response timeout (dropped at it: only
    /// requests that change something must land before the holder's next call).
    pub(super) async fn read<T>(
        &self,
        query: impl Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        match self.inner.response_timeout {
            Some(limit) => tokio::time::timeout(limit, query)
                .await
                .unwrap_or_else(|_| Err(timed_out())),
            None => query.await,
        }
    }

    /// Runs a script request, its caller waiting at most the response timeout. A request
    /// that writes is not dropped there but lands (or fails) before the holder's next call
    /// (`crate::serial::within`): a clean-up never overtakes the save it takes back. One that
    /// only reads is dropped at the timeout, as [`read`](Self::read) does.
    async fn landing<T: Send + 'static>(
        &self,
        read_only: bool,
        request: impl Future<Output = redis::RedisResult<T>> + Send + 'static,
    ) -> redis::RedisResult<T> {
        match self.inner.response_timeout {
            Some(_) if read_only => self.read(request).await,
            Some(limit) => crate::serial::within(limit, request)
                .await
                .unwrap_or_else(|| Err(timed_out())),
            None => request.await,
        }
    }

    /// How many times Sentinel's master changed (0 without Sentinel): a connection opened
    /// before the last change is not used.
    fn master_epoch(&self) -> u64 {
        self.inner
            .servers
            .sentinel()
            .map_or(0, |s| *s.changes.borrow())
    }

    /// Forgets the connection, so the next operation opens a new one on the runtime it runs on
    /// (and, on Sentinel, asks the sentinels for the master again).
    pub(super) fn forget_conn(&self) {
        *lock(&self.inner.conn) = None;
        if let Some(sentinel) = self.inner.servers.sentinel() {
            sentinel.forget();
        }
    }

    pub(super) fn redis_error(&self, err: redis::RedisError, resource: Option<&str>) -> Error {
        if self.inner.servers.sentinel().is_some() && master_moved(&err) {
            // The master is gone or was demoted: the next request asks the sentinels.
            self.forget_conn();
        }
        if speaks_another_protocol(&err) {
            // The parser's dump of the bytes adds nothing but lines.
            let out = Error::storage(NOT_REDIS).with_store(self);
            return match resource {
                Some(r) => out.with_resource(r),
                None => out,
            };
        }
        // A cluster's redirections, a slot under migration, a cluster or master down, a
        // demoted master: a fail-over or a reshard under way, over once it is.
        let moving = err.is_cluster_error()
            || matches!(
                err.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::MasterDown | redis::ServerErrorKind::ReadOnly
                )
            )
            || matches!(err.kind(), redis::ErrorKind::ClusterConnectionNotFound);
        let temporary = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_refusal()
            || err.is_connection_dropped()
            || moving;
        if let Some(why) = auth_refusal(&err) {
            // Said in words; the client's text would only say it again in its own terms.
            let out = Error::storage(why).with_store(self);
            return match resource {
                Some(r) => out.with_resource(r),
                None => out,
            };
        }
        let reason = if err.kind() == redis::ErrorKind::InvalidClientConfig {
            format!("the Redis client refuses its configuration: {err}")
        } else if err.is_timeout() {
            "the Redis server did not answer in time".to_owned()
        } else if err.is_connection_refusal() || err.is_io_error() || err.is_connection_dropped() {
            format!("cannot reach the Redis server: {err}")
        } else {
            format!("the Redis server refused: {err}")
        };
        let mut out = Error::storage(reason).with_store(self).with_source(err);
        if let Some(r) = resource {
            out = out.with_resource(r);
        }
        if temporary { out.temporary() } else { out }
    }

    /// Whether scripts must be given the client's clock; probes once per store.
    async fn client_clock(&self, conn: &mut Conn) -> Result<bool> {
        if let Some(mode) = *lock(&self.inner.client_clock) {
            return Ok(mode);
        }
        let probe_key = self.internal_key(PROBE_KEY);
        // Bounded by the response timeout (its effect need not land before anything).
        let outcome: redis::RedisResult<i64> = self
            .read(self.inner.scripts.probe.key(&probe_key).invoke_async(conn))
            .await;
        let mode = match outcome {
            Ok(_) => false,
            Err(e) if CLOCK_REFUSALS.iter().any(|t| e.to_string().contains(t)) => true,
            Err(e) => return Err(self.redis_error(e, None)),
        };
        *lock(&self.inner.client_clock) = Some(mode);
        Ok(mode)
    }

    /// Runs `script` for `key`: KEYS = the lock key, then what `keys` asks for; ARGV = client
    /// time or "", token, duration ms, then the waiter's `ticket` and when its wait began (µs),
    /// or "" twice.
    pub(super) async fn eval<T: redis::FromRedisValue + Send + 'static>(
        &self,
        script: &redis::Script,
        key: &Key,
        ttl: Option<Duration>,
        keys: Keys,
        ticket: Option<(&str, u64)>,
    ) -> Result<T> {
        let call = self.call_for(key, keys, ticket);
        self.eval_call(script, key, ttl, call).await
    }

    /// The keys and extra arguments of a script for `key` that takes `keys`.
    pub(super) fn call_for<'a>(
        &self,
        key: &Key,
        keys: Keys,
        ticket: Option<(&'a str, u64)>,
    ) -> Call<'a> {
        Call {
            keys: self.script_keys(key, keys),
            read_only: keys == Keys::ReadOnly,
            ticket,
            extra: match keys {
                // `ARGV[7]`: `b` lets this newcomer past queued waiters (`fair=false`).
                Keys::Save => vec![
                    meta_arg(key),
                    if self.inner.fair { "" } else { "b" }.to_owned(),
                ],
                _ => Vec::new(),
            },
        }
    }

    /// Runs `script` for `key` with the keys and extra arguments `call` gives (ARGV as for
    /// [`eval`](Self::eval), then `call.extra`).
    pub(super) async fn eval_call<T: redis::FromRedisValue + Send + 'static>(
        &self,
        script: &redis::Script,
        key: &Key,
        ttl: Option<Duration>,
        call: Call<'_>,
    ) -> Result<T> {
        let read_only = call.read_only;
        let (conn, keys_of, args) = self.prepare(key, ttl, call).await?;
        let script = script.clone();
        let run = move |mut conn: Conn| {
            let (script, keys_of, args) = (script.clone(), keys_of.clone(), args.clone());
            async move {
                let mut invocation = script.prepare_invoke();
                for k in &keys_of {
                    invocation.key(k);
                }
                for a in &args {
                    invocation.arg(a);
                }
                invocation.invoke_async::<T>(&mut conn).await
            }
        };
        self.run_once_more_on_a_new_connection(key, read_only, conn, run)
            .await
    }

    /// A script that writes what a holder's lock stands on (a save, a renewal) and, with
    /// `wait_replicas`, `WAIT` for the replicas in the same pipeline on the same connection (to
    /// the master of the script's slot), so the count is this write's. The script's answer,
    /// and whether the replicas confirmed it (always, without `wait_replicas`).
    pub(super) async fn eval_durable<T: redis::FromRedisValue + Send + 'static>(
        &self,
        script: &redis::Script,
        key: &Key,
        ttl: Option<Duration>,
        call: Call<'_>,
    ) -> Result<(T, bool)> {
        let Some(durability) = self.inner.durability else {
            return self
                .eval_call(script, key, ttl, call)
                .await
                .map(|t| (t, true));
        };
        let (conn, keys_of, args) = self.prepare(key, ttl, call).await?;
        let slot = super::layout::slot_of(&keys_of[0]);
        let ms = u64::try_from(durability.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(keys_of.len())
            .arg(&keys_of)
            .arg(&args);
        pipe.cmd("WAIT").arg(durability.replicas).arg(ms);
        let script = script.clone();
        let run = move |mut conn: Conn| {
            let (script, pipe) = (script.clone(), pipe.clone());
            async move {
                let answer = match conn.pipeline_on_slot_master(&pipe, slot).await {
                    // Not loaded on this node yet: load it, then the whole pipeline again.
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        script.prepare_invoke().load_async(&mut conn).await?;
                        conn.pipeline_on_slot_master(&pipe, slot).await
                    }
                    other => other,
                }?;
                let mut answer = answer.into_iter();
                let (Some(value), Some(waited)) = (answer.next(), answer.next()) else {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Parse,
                        "a script and WAIT gave fewer than two answers",
                    )));
                };
                let waited: i64 = redis::from_redis_value(waited)?;
                Ok((redis::from_redis_value::<T>(value)?, waited))
            }
        };
        let (value, waited) = self
            .run_once_more_on_a_new_connection(key, false, conn, run)
            .await?;
        Ok((value, waited >= i64::from(durability.replicas)))
    }

    /// The error of a durable write whose replicas did not confirm it in time (temporary: a
    /// fresh grant is taken back by the lock, a renewal tried again within the lease).
    pub(super) fn unconfirmed(&self, key: &Key) -> Error {
        let (replicas, timeout) = self
            .inner
            .durability
            .map_or((0, Duration::ZERO), |d| (d.replicas, d.timeout));
        Error::storage(format!(
            "fewer than the {replicas} replicas wait_replicas asks for confirmed the write within \
             {timeout:?}"
        ))
        .with_store(self)
        .with_resource(key.resource())
        .temporary()
    }

    /// The connection, and the keys and arguments of a script call for `key`.
    async fn prepare(
        &self,
        key: &Key,
        ttl: Option<Duration>,
        call: Call<'_>,
    ) -> Result<(Conn, Vec<Vec<u8>>, Vec<Vec<u8>>)> {
        let Call {
            keys: keys_of,
            read_only,
            ticket,
            extra,
        } = call;
        let mut conn = self
            .conn()
            .await
            .map_err(|e| e.with_resource(key.resource()))?;
        let client_clock = if read_only {
            // Reading TIME without writing needs no probe (and must work on a replica, where
            // the probe's write is refused): the probe's verdict if known, else the server's.
            lock(&self.inner.client_clock).unwrap_or(false)
        } else {
            self.client_clock(&mut conn)
                .await
                .map_err(|e| e.with_resource(key.resource()))?
        };
        let mut args: Vec<Vec<u8>> = [
            client_time(client_clock),
            key.token(KIND),
            ttl.map_or(0, duration_ms).to_string(),
            ticket.map_or_else(String::new, |(text, _)| text.to_owned()),
            ticket.map_or_else(String::new, |(_, since_us)| since_us.to_string()),
        ]
        .into_iter()
        .chain(extra)
        .map(String::into_bytes)
        .collect();
        // Last: how the script wakes a waiter (see `PRELUDE`'s `wake`).
        args.push(self.wake_arg(&keys_of[0]));
        Ok((conn, keys_of, args))
    }

    /// Runs `run` on `conn` within the bounds of [`landing`](Self::landing). When the
    /// connection's driver task ran on a runtime that has ended (a store used again from a
    /// second runtime), the request never left: reconnect here and run it once more. The
    /// scripts are idempotent for one token, so a retry cannot double an effect (except that
    /// a save granted twice reports its fencing token only the first time).
    async fn run_once_more_on_a_new_connection<R, F>(
        &self,
        key: &Key,
        read_only: bool,
        conn: Conn,
        run: impl Fn(Conn) -> F,
    ) -> Result<R>
    where
        R: Send + 'static,
        F: Future<Output = redis::RedisResult<R>> + Send + 'static,
    {
        match self.landing(read_only, run(conn)).await {
            Err(e)
                if e.is_io_error() && !e.is_timeout() && e.to_string().contains("broken pipe") =>
            {
                self.forget_conn();
                let conn = self
                    .conn()
                    .await
                    .map_err(|e| e.with_resource(key.resource()))?;
                self.landing(read_only, run(conn))
                    .await
                    .map_err(|e| self.redis_error(e, Some(key.resource())))
            }
            other => other.map_err(|e| self.redis_error(e, Some(key.resource()))),
        }
    }

    /// The last argument of every script: `P` and the wake channel's head on one server
    /// (`PUBLISH`), or `S` and the sharded channel's head in the slot of `anchor` (the script's
    /// first key) on a cluster (`SPUBLISH`, which a script may only do in its keys' slot). The
    /// waiter's store id follows the head.
    fn wake_arg(&self, anchor: &[u8]) -> Vec<u8> {
        let layout = &self.inner.layout;
        if layout.is_slotted() {
            let mut arg = vec![b'S'];
            arg.extend(layout.slot_head(super::layout::slot_of(anchor)));
            arg.extend_from_slice(super::layout::SHARDED_WAKE);
            arg
        } else {
            let mut arg = vec![b'P'];
            arg.extend_from_slice(super::layout::WAKE_CHANNEL.as_bytes());
            arg
        }
    }

    /// The keys a script for `key` takes: the lock key, then what `keys` asks for.
    pub(super) fn script_keys(&self, key: &Key, keys: Keys) -> Vec<Vec<u8>> {
        let mut keys_of: Vec<Vec<u8>> = vec![self.key_for(key.resource()).into()];
        let record = || self.record_key(key.resource(), &key.token(KIND));
        match keys {
            Keys::Save => {
                keys_of.push(self.fence_key(&self.key_for(key.resource())));
                keys_of.push(self.queue_key(key.resource()));
                keys_of.push(record());
            }
            Keys::Queue => {
                keys_of.push(self.queue_key(key.resource()));
                keys_of.push(record());
                keys_of.push(self.fence_key(&self.key_for(key.resource())));
            }
            Keys::Lock => keys_of.push(record()),
            Keys::ReadOnly => {}
        }
        keys_of
    }
}

/// Whether an error says the master Sentinel gave is no longer reachable or no longer the
/// master (a fail-over).
fn master_moved(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_refusal()
        || err.is_connection_dropped()
        || err.code() == Some("READONLY")
        || err.to_string().contains("READONLY")
}

/// A save's metadata argument: `""` for none, else `m` and the bytes in standard base64 (which
/// the script puts into the record's JSON as it is: base64 needs no escaping).
pub(super) fn meta_arg(key: &Key) -> String {
    use base64::Engine as _;
    key.meta().map_or_else(String::new, |m| {
        format!(
            "m{}",
            base64::engine::general_purpose::STANDARD.encode(&m[..])
        )
    })
}

/// The client's Unix time in seconds for a script, when it must be given the client's clock;
/// else "" (the script reads the server's).
fn client_time(client_clock: bool) -> String {
    if client_clock {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        format!("{:.6}", t.as_secs_f64())
    } else {
        String::new()
    }
}

/// What a request the caller stopped waiting for at the response timeout answers.
/// What an answer the client cannot parse means: the server at the address speaks another
/// protocol (Memcached, a database, HTTP), not Redis's.
pub(crate) const NOT_REDIS: &str =
    "the server does not speak the Redis protocol (is a Redis server at this address?)";

/// Whether `err` is the parser's refusal of an answer that is not in Redis's protocol, whose
/// text dumps the bytes it could not read over several lines.
pub(crate) fn speaks_another_protocol(err: &redis::RedisError) -> bool {
    err.kind() == redis::ErrorKind::Parse && err.to_string().contains("Parse error")
}

fn timed_out() -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer within the response timeout",
    )
    .into()
}

/// A script call's keys and arguments beyond the common ones (see [`RedisStore::eval_call`]).
pub(super) struct Call<'a> {
    pub(super) keys: Vec<Vec<u8>>,
    /// The script only reads (it runs without the clock probe, and is dropped at the timeout).
    pub(super) read_only: bool,
    pub(super) ticket: Option<(&'a str, u64)>,
    pub(super) extra: Vec<String>,
}

/// The keys a script takes after the lock key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keys {
    /// The holder's record, and the script writes (refresh).
    Lock,
    /// None, and the script only reads (it runs without the clock probe).
    ReadOnly,
    /// The resource's wait queue, the holder's record and the fencing counter (delete, wake,
    /// leave, revoke: a release may grant the lock to the next waiter).
    Queue,
    /// The fencing counter, the wait queue and the holder's record (the saves; the metadata
    /// goes with them as `ARGV[6]`).
    Save,
}

/// Integer milliseconds, rounded up, as the peers put durations on the wire.
fn duration_ms(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

/// What a server's refusal of the DSN's credentials means, in words (the client's own text,
/// "Password authentication failed - AuthenticationFailed" or `"NOAUTH": Authentication
/// required.`, says it in its own terms); `None` for any other error.
fn auth_refusal(err: &redis::RedisError) -> Option<&'static str> {
    if err.kind() == redis::ErrorKind::AuthenticationFailed {
        Some(
            "the Redis server refused the DSN's credentials (a wrong user name or password, or a \
             disabled user)",
        )
    } else if err.code() == Some("NOAUTH") {
        Some(
            "the Redis server requires a password, and the DSN gives none \
             (redis://[user]:password@host)",
        )
    } else {
        None
    }
}
