//! The command connection of a Redis store: opened on first use, one attempt at a time within
//! the connect timeout, its failure shared; the clock probe; running a script for a key.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{FENCE_KEY, KIND, PROBE_KEY, RedisStore, lock, notify};
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
    fn cached_conn(&self) -> Option<ConnectionManager> {
        lock(&self.inner.conn).clone()
    }

    pub(super) async fn conn(&self) -> Result<ConnectionManager> {
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
        let _one = inner.connecting.lock().await;
        if let Some(conn) = self.cached_conn() {
            return Ok(conn);
        }
        // An attempt failed while this request waited for it: its outcome is this one's too,
        // rather than one more full timeout per request in the queue.
        if let Some(f) = lock(&inner.failed).as_ref().filter(|f| f.seq != seen) {
            return Err(f.error(self));
        }
        let cfg = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(inner.connect_timeout)
            .set_response_timeout(inner.response_timeout);
        let connecting = ConnectionManager::new_with_config(inner.client.clone(), cfg);
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
        let conn = match outcome {
            Ok(conn) => conn,
            Err(err) => {
                let mut failed = lock(&inner.failed);
                let seq = failed.as_ref().map_or(0, |f| f.seq) + 1;
                *failed = Some(ConnectFailure {
                    at: Instant::now(),
                    seq,
                    reason: err.reason().unwrap_or("cannot connect").to_owned(),
                    temporary: err.is_temporary(),
                });
                return Err(err);
            }
        };
        *lock(&inner.conn) = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets the connection, so the next operation opens a new one on the runtime it runs on.
    pub(super) fn forget_conn(&self) {
        *lock(&self.inner.conn) = None;
    }

    pub(super) fn redis_error(&self, err: redis::RedisError, resource: Option<&str>) -> Error {
        let temporary = err.is_io_error()
            || err.is_timeout()
            || err.is_connection_refusal()
            || err.is_connection_dropped();
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
    async fn client_clock(&self, conn: &mut ConnectionManager) -> Result<bool> {
        if let Some(mode) = *lock(&self.inner.client_clock) {
            return Ok(mode);
        }
        let probe_key = self.internal_key(PROBE_KEY);
        let outcome: redis::RedisResult<i64> = self
            .inner
            .scripts
            .probe
            .key(&probe_key)
            .invoke_async(conn)
            .await;
        let mode = match outcome {
            Ok(_) => false,
            Err(e) if CLOCK_REFUSALS.iter().any(|t| e.to_string().contains(t)) => true,
            Err(e) => return Err(self.redis_error(e, None)),
        };
        *lock(&self.inner.client_clock) = Some(mode);
        Ok(mode)
    }

    /// Runs `script` for `key`: ARGV = client time or "", token, duration ms, release channel.
    pub(super) async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        key: &Key,
        ttl: Option<Duration>,
        with_fence_key: bool,
        read_only: bool,
    ) -> Result<T> {
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
        let lock_key = self.key_for(key.resource());
        let mut invocation = script.key(&lock_key);
        if with_fence_key {
            invocation.key(self.internal_key(FENCE_KEY));
        }
        let now = if client_clock {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            format!("{:.6}", t.as_secs_f64())
        } else {
            String::new()
        };
        invocation
            .arg(now)
            .arg(key.token(KIND))
            .arg(ttl.map_or(0, duration_ms))
            .arg(notify::channel(&lock_key));
        match invocation.invoke_async(&mut conn).await {
            // The connection's driver task ran on a runtime that has ended (a store used from a
            // second runtime: a key used again from a second runtime), so the request never left. Reconnect here and retry once;
            // the scripts are idempotent for one token, so a retry cannot double an effect
            // (except that a save granted twice reports its fencing token only the first time).
            Err(e)
                if e.is_io_error() && !e.is_timeout() && e.to_string().contains("broken pipe") =>
            {
                self.forget_conn();
                let mut conn = self
                    .conn()
                    .await
                    .map_err(|e| e.with_resource(key.resource()))?;
                invocation
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| self.redis_error(e, Some(key.resource())))
            }
            other => other.map_err(|e| self.redis_error(e, Some(key.resource()))),
        }
    }
}

/// Integer milliseconds, rounded up, as the peers put durations on the wire.
fn duration_ms(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}
