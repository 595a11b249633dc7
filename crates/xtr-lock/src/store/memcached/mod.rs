//! [`MemcachedStore`]: locks in Memcached, in Symfony Lock's `MemcachedStore` layout, released
//! with a conditional delete.

use std::fmt;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;

use super::{
    Acquired, Capabilities, Conflict, HandleOwner, HolderInfo, Holding, LostReason, Saved, Store,
    Watcher, check_expiry,
};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::store::channels::Channels;
use crate::store::held::{Claim, Held};

mod check;
mod config;
mod conn;
mod input;
mod ops;
mod records;
mod release;
mod sem_ops;
mod semaphore;

use crate::mutex::lock;
use conn::{Conn, Pool};
use ops::{Attempt, Found, acquire_on, delete_on, put_off_on};

/// The token kind: one token per key for Memcached stores.
const KIND: &str = "memcached";

/// The longest ttl Memcached reads as relative: a longer one is taken for a Unix timestamp.
const MAX_TTL_SECS: u64 = 30 * 24 * 3600;

/// Checks a Memcached DSN without building anything.
pub(crate) fn validate_dsn(dsn: &str) -> Result<()> {
    config::parse(dsn).map(|_| ())
}

/// Locks in Memcached (1.6 or later), one entry per resource, shared with Symfony Lock's
/// `MemcachedStore` (over php-memcached), so Rust and PHP processes exclude each other.
///
/// - The entry's key is the resource itself, its value the holder's token (44 characters),
///   stored with flags 0 as php-memcached stores a string; its expiry is the ttl in whole
///   seconds, rounded up.
/// - Acquire is an add (`ms … ME`); a holder that re-acquires or refreshes reads the entry
///   (`mg`) and replaces it only while its CAS is the one read (`ms … C<cas>`). A refresh never
///   revives an entry that is gone: that lock was lost.
/// - **Release deletes only the holder's own entry**: `mg` reads value and CAS, and
///   `md <key> C<cas>` deletes only while the entry is unchanged. An entry that expired and was
///   taken by someone else in between is left alone. (Symfony shortens the entry with a CAS and
///   then deletes it unconditionally, which deletes a new holder's lock if the entry changes
///   hands between the two.)
/// - Waiters are woken at once by a release through the same store (in this process);
///   releases elsewhere, PHP's included, are found by the lock's 90–110 ms poll, as Symfony's
///   waiters find them: Memcached has no notifications.
///
/// # Guarantees
///
/// Excludes everyone using this layout on the same server. A lock outlives a crashed holder
/// until its ttl.
///
/// # What Memcached cannot promise
///
/// - **Eviction**: under memory pressure the server may evict a live lock (LRU); the holder
///   finds out at its next refresh or check, and meanwhile another process may take it. Give
///   locks a server (or enough memory) of their own.
/// - **`flush_all`** removes every lock at once; so does a restart (nothing persists).
/// - Expiry is counted in whole seconds on the server's clock, which ticks once a second: an
///   entry may end up to 1 s before its ttl. The lock's own deadline is the ttl less that
///   second, so a ttl of at least 2 s is needed; ttls over 30 days are refused (Memcached would
///   read them as timestamps).
/// - **No fencing tokens**: Memcached has no durable counter.
/// - Names are keys, unchanged (so PHP shares them): 1 to 250 bytes, without spaces or control
///   characters. Other names are refused.
/// - One server per store; no SASL (it needs the binary protocol).
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use std::time::Duration;
/// use xtr_lock::{LockFactory, Lockable as _, MemcachedStore};
///
/// let store = MemcachedStore::from_dsn("memcached://localhost:11211")?;
/// let lock = LockFactory::new(store).create_lock("invoice:42").with_ttl(Duration::from_secs(30));
/// if lock.try_acquire().await? {
///     let _ = lock.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemcachedStore {
    inner: Arc<Inner>,
}

struct Inner {
    shown: String,
    pool: Pool,
    /// The holders of this store: resource → token, to tell whether a refusal came from a
    /// holder whose release wakes our waiters.
    held: Held,
    /// Waiters of this store per resource, woken by its releases.
    wakers: std::sync::Mutex<Channels>,
    /// Owns the holders' [`HolderState`] handles.
    owner: HandleOwner,
}

/// What the store keeps on a holder's key.
#[derive(Default)]
struct HolderState {
    /// Whether its last refusal came from a holder of this store (whose release wakes it).
    here: Arc<AtomicBool>,
    /// The holder's token was made by an add here that never had a connection to send it on
    /// (the server unreachable, the caller gone): its release has nothing to delete.
    unsent: Arc<AtomicBool>,
    /// Its entry among the store's holders, gone with the key.
    claim: std::sync::Mutex<Option<Claim>>,
    /// When it acquired, while it holds (its record keeps it across re-saves).
    acquired_at: std::sync::Mutex<Option<SystemTime>>,
}

/// How one request runs.
struct Run {
    /// Its bound: the response timeout, or less (what is left of the lifetime an add or
    /// renewal can keep: an answer after it is of no use).
    limit: Duration,
    /// Given up while no connection is had yet, once its caller stopped waiting: nothing was
    /// sent, so nothing needs undoing. A release never is.
    abandon: bool,
    /// Cleared as soon as a connection is had for it (the request may be sent from then on).
    unsent: Option<Arc<AtomicBool>>,
}

/// The shortest bound of an add or renewal whose lifetime is nearly over.
const MIN_LIMIT: Duration = Duration::from_millis(250);

impl MemcachedStore {
    /// A store on the server `dsn` names: `memcached://host[:port]` (port 11211 by default) or
    /// `memcached:///path/to/socket`, with the options `connect_timeout` and `timeout` (seconds,
    /// default 5). Touches no network: the connection opens on first use.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a malformed DSN,
    /// showing its scheme only.
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        let config = config::parse(dsn)?;
        Ok(MemcachedStore {
            inner: Arc::new(Inner {
                shown: config.shown.clone(),
                pool: Pool::new(config),
                held: Held::default(),
                wakers: std::sync::Mutex::new(Channels::default()),
                owner: HandleOwner::new(),
            }),
        })
    }

    /// Whether Memcached can keep `resource` as a key, unchanged: 1 to 250 bytes, without
    /// spaces or control characters.
    pub fn is_valid_name(resource: &str) -> bool {
        (1..=250).contains(&resource.len()) && resource.bytes().all(|b| b > b' ' && b != 0x7f)
    }

    /// Runs `f` on a pooled connection within the response timeout.
    ///
    /// A request given up on at the timeout is not dropped: it finishes after the lock's store
    /// call, before the holder's next one (`crate::serial::within`), so a dropped or timed-out
    /// acquire's request has landed, or failed, before the clean-up delete reads the entry.
    /// Without that order the delete could reach the server first, on another connection, and
    /// find nothing to remove.
    ///
    /// The connection goes back to the pool only when `f` completed without error. A pooled
    /// connection found closed (the server restarted since) is dropped with the rest of the
    /// pool and `f` runs again on a new one: every operation here is safe to repeat (each reads
    /// before it writes, and an add that landed is re-taken by its own token).
    ///
    /// Waiting for a new connection (the server down, paused or cut off) ends as soon as the
    /// caller stops waiting or the bound passes, unless `how` is a release.
    async fn run<T, F, Fut>(&self, resource: &str, how: Run, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Conn) -> Fut + Send + 'static,
        Fut: Future<Output = (Conn, io::Result<T>)> + Send,
    {
        let inner = self.inner.clone();
        let Run {
            limit,
            abandon,
            unsent,
        } = how;
        // Dropped when `within` returns: a remainder still connecting then stops.
        let (within_bound, bound) = tokio::sync::watch::channel(());
        let work = async move {
            let pool = &inner.pool;
            let get = |fresh| {
                let mut bound = bound.clone();
                async move {
                    if !abandon {
                        return pool.get(fresh).await;
                    }
                    tokio::select! {
                        biased;
                        got = pool.get(fresh) => got,
                        _ = bound.changed() => Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "gave up before reaching the server: its bound passed",
                        )),
                        () = crate::serial::caller_left() => Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "gave up before reaching the server: nobody waits for the answer \
                             any more",
                        )),
                    }
                }
            };
            let (conn, reused) = get(false).await?;
            if let Some(unsent) = &unsent {
                unsent.store(false, Ordering::Release);
            }
            let done = match f(conn).await {
                (_, Err(e)) if reused && conn::is_closed(&e) => {
                    pool.close();
                    let (conn, _) = get(true).await?;
                    f(conn).await
                }
                other => other,
            };
            match done {
                (conn, Ok(v)) => {
                    pool.put(conn);
                    Ok(v)
                }
                (_, Err(e)) => Err(e),
            }
        };
        let done = crate::serial::within(limit, work).await;
        drop(within_bound);
        let done = done.unwrap_or_else(|| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {limit:?}"),
            ))
        });
        done.map_err(|e| self.io_error(resource, e))
    }

    /// A request bounded by the response timeout.
    fn plain(&self) -> Run {
        Run {
            limit: self.inner.pool.timeout(),
            abandon: true,
            unsent: None,
        }
    }

    /// A request bounded by what is left of `key`'s lifetime too (at least a moment).
    fn keeping(&self, key: &Key) -> Run {
        let timeout = self.inner.pool.timeout();
        let left = key
            .remaining_lifetime()
            .map_or(timeout, |l| l.max(MIN_LIMIT));
        Run {
            limit: timeout.min(left),
            ..self.plain()
        }
    }

    /// Forgets `token` as the holder of `resource` (released or lost) and wakes this store's
    /// waiters on it.
    fn forget(&self, resource: &str, token: &str) {
        self.inner.held.forget(resource, token);
        lock(&self.inner.wakers).notify(resource);
    }

    /// The whole seconds of an acquisition's entries: at least 2 (they may end 1 s early).
    fn lifetime_secs(&self, key: &Key, ttl: Option<Duration>) -> Result<u64> {
        let secs = self.seconds(key, ttl)?;
        if secs < 2 {
            return Err(Error::invalid_argument(format!(
                "a lock in Memcached needs a ttl of at least 2 s, not {:?}: entries keep whole \
                 seconds and may end up to 1 s early",
                ttl.unwrap_or_default()
            ))
            .with_resource(key.resource())
            .with_store(self));
        }
        Ok(secs)
    }

    /// What an add (a lock's or a semaphore's) is sent with: its lifetime in whole seconds,
    /// the holder's state, its token, and how to run the request. The entry may end up to 1 s
    /// early: the key's local deadline is set one second less first, before the round trip.
    fn before_add(
        &self,
        key: &Key,
        ttl: Option<Duration>,
    ) -> Result<(u64, Arc<HolderState>, String, Run)> {
        let secs = self.lifetime_secs(key, ttl)?;
        key.reduce_lifetime(Duration::from_secs(secs - 1));
        if key.is_expired() {
            return Err(Error::expired(key.resource()).with_store(self));
        }
        let state = key.handle::<HolderState>(self.inner.owner);
        if !key.has_token(KIND) {
            // A token made now was never sent: until a request may carry it, a release of
            // this holder has nothing to delete.
            state.unsent.store(true, Ordering::Release);
        }
        let token = key.token(KIND);
        let how = Run {
            unsent: Some(state.unsent.clone()),
            ..self.keeping(key)
        };
        Ok((secs, state, token, how))
    }

    async fn acquire(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        let name = self.name(key.resource())?;
        let (secs, state, token, how) = self.before_add(key, ttl)?;
        let rec_key = records::lock_record(&name, token.as_bytes());
        let record = self.record_to_set(key, &state, &rec_key, &token, secs);
        let attempt = self
            .run(key.resource(), how, move |mut c| {
                let (name, token, record) = (name.clone(), token.clone(), record.clone());
                let rec_key = rec_key.clone();
                async move {
                    // Before the add: whoever sees this holder finds its record.
                    records::queue(&mut c, &record).await;
                    let r = acquire_on(&mut c, &name, token.as_bytes(), secs).await;
                    // Refused for another holder only: after many lost CAS rounds on its own
                    // entry (`Refused` naming nobody) the holder may hold, record and all.
                    if matches!(&r, Ok(Attempt::Refused(other, _)) if !other.is_empty() && other != token.as_bytes())
                    {
                        records::queue(&mut c, &records::delete(&rec_key)).await;
                    }
                    (c, r)
                }
            })
            .await?;
        match attempt {
            Attempt::Acquired => {
                self.inner
                    .held
                    .hold(&state.claim, key.resource(), &key.token(KIND));
                check_expiry(self, key).await?;
                Ok(Saved::Acquired(Acquired::new()))
            }
            Attempt::Refused(holder, left) => {
                // A holder of this store announces its release to our waiters; anyone else's
                // release is found by polling.
                // Refused: whatever this holder held here is gone.
                self.inner.held.forget(key.resource(), &key.token(KIND));
                *lock(&state.acquired_at) = None;
                let here = self
                    .inner
                    .held
                    .held_by(key.resource(), |t| t.as_bytes() == holder.as_slice());
                state.here.store(here, Ordering::Release);
                let conflict = Conflict::new();
                Ok(Saved::Conflict(match left {
                    Some(s) if s > 0 => conflict.with_retry_after(Duration::from_secs(s)),
                    _ => conflict,
                }))
            }
        }
    }
}

impl fmt::Display for MemcachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.shown)
    }
}

impl fmt::Debug for MemcachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedStore")
            .field("server", &self.inner.shown)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for MemcachedStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: true,
            shared: false,
            blocking: false,
            blocking_shared: false,
            expiring: true,
            fencing: false,
            notifies: true,
            serializable_keys: true,
            introspection: true,
            liveness: false,
            observes_loss: false,
            leased: false,
            counting: true,
            metadata: true,
            lists: false,
            fair: false,
        }
    }

    /// The server as addressed: `memcached://host:11211`.
    fn locks_in(&self) -> Option<String> {
        Some(self.inner.shown.clone())
    }

    /// The entry's key and the server: `key "invoice:42" in memcached://host:11211`.
    fn location(&self, resource: &str) -> Option<String> {
        Some(format!("key {resource:?} in {}", self.inner.shown))
    }

    /// An add, or for the holder that already holds, a read and a CAS replace.
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        if let Some(permits) = key.permits() {
            return self.sem_save(key, permits, ttl).await;
        }
        self.acquire(key, ttl).await
    }

    /// A read and a CAS replace with the new expiry; an entry that is gone is not re-created.
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        if let Some(permits) = key.permits() {
            return self.sem_put_off(key, permits, ttl).await;
        }
        if !key.has_token(KIND) {
            return Ok(Holding::NotHeld(LostReason::Removed));
        }
        let secs = self.seconds(key, Some(ttl))?;
        let was_expired = key.is_expired();
        if secs < 2 {
            // Not keepable in whole seconds that may end 1 s early: it ends at once.
            key.reduce_lifetime(Duration::ZERO);
            check_expiry(self, key).await?;
        }
        let name = self.name(key.resource())?;
        key.reduce_lifetime(Duration::from_secs(secs.saturating_sub(1)));
        let token = key.token(KIND);
        let touch = records::touch(&records::lock_record(&name, token.as_bytes()), secs);
        let found = self
            .run(key.resource(), self.keeping(key), move |mut c| {
                let (name, token, touch) = (name.clone(), token.clone(), touch.clone());
                async move {
                    let r = put_off_on(&mut c, &name, token.as_bytes(), secs).await;
                    if matches!(r, Ok(Found::Ours)) {
                        records::queue(&mut c, &touch).await;
                    }
                    (c, r)
                }
            })
            .await?;
        match found {
            Found::Ours => {
                check_expiry(self, key).await?;
                Ok(Holding::Held(Mode::Write))
            }
            lost => {
                self.forget(key.resource(), &key.token(KIND));
                *lock(&key.handle::<HolderState>(self.inner.owner).acquired_at) = None;
                Ok(Holding::NotHeld(match lost {
                    Found::Other => LostReason::TakenOver,
                    _ if was_expired => LostReason::Expired,
                    _ => LostReason::Removed,
                }))
            }
        }
    }

    /// A read and a CAS replace with an exptime that outlasts `after` (whole seconds, rounded
    /// up, plus the one Memcached may end an entry early), the record touched alike.
    async fn release_after(&self, key: &Key, after: Duration) -> Result<Option<Holding>> {
        self.release_later(key, after).await
    }

    /// A read and a delete conditional on the CAS read: `true` only if the holder's own entry
    /// was deleted. An entry that changed hands in between is never touched.
    async fn delete(&self, key: &Key) -> Result<bool> {
        if let Some(permits) = key.permits() {
            return self.sem_delete(key, permits).await;
        }
        if !key.has_token(KIND) || !Self::is_valid_name(key.resource()) {
            return Ok(false);
        }
        let (name, token) = (key.resource().to_owned(), key.token(KIND));
        let state = key.handle::<HolderState>(self.inner.owner);
        *lock(&state.acquired_at) = None;
        if state.unsent.load(Ordering::Acquire) {
            // Nothing of this holder ever reached the server.
            self.forget(&name, &token);
            return Ok(false);
        }
        let release = Run {
            abandon: false,
            ..self.plain()
        };
        let deleted = {
            let (name, token) = (name.clone(), token.clone());
            self.run(key.resource(), release, move |mut c| {
                let (name, token) = (name.clone(), token.clone());
                async move {
                    let r = delete_on(&mut c, &name, token.as_bytes()).await;
                    if matches!(r, Ok(true)) {
                        let record =
                            records::delete(&records::lock_record(&name, token.as_bytes()));
                        records::queue(&mut c, &record).await;
                    }
                    (c, r)
                }
            })
            .await
        };
        self.forget(&name, &token);
        deleted
    }

    /// Registers the holder as a waiter for the next release by a holder of this store (in
    /// this process). Releases by other processes, PHP's included, are seen by polling: the
    /// watcher says it covers a release only when the last refusal came from a holder here.
    async fn watch(&self, key: &Key, _waiting_since: SystemTime) -> Result<Option<Watcher>> {
        let wake = match key.permits() {
            Some(_) => Self::sem_wake(key.resource()),
            None => key.resource().to_owned(),
        };
        let mut rx = lock(&self.inner.wakers).subscribe(&wake);
        let here = key.handle::<HolderState>(self.inner.owner).here.clone();
        Ok(Some(Watcher::with_coverage(
            async move {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            },
            move || here.load(Ordering::Acquire),
        )))
    }

    /// One read: the entry holds the holder's token.
    async fn exists(&self, key: &Key) -> Result<Holding> {
        if let Some(permits) = key.permits() {
            return self.sem_exists(key, permits).await;
        }
        if !key.has_token(KIND) || !Self::is_valid_name(key.resource()) {
            return Ok(Holding::NotHeld(LostReason::Removed));
        }
        let (name, token) = (key.resource().to_owned(), key.token(KIND));
        let entry = self
            .run(key.resource(), self.plain(), move |mut c| {
                let name = name.clone();
                async move {
                    let r = c.get(&name).await;
                    (c, r)
                }
            })
            .await?;
        Ok(match entry {
            Some(e) if e.value == token.as_bytes() => Holding::Held(Mode::Write),
            Some(_) => Holding::NotHeld(LostReason::TakenOver),
            None => Holding::NotHeld(LostReason::Removed),
        })
    }

    /// The entry's holder (by its token's digest), the seconds its entry has left, and its
    /// record (read with the entry, pipelined: one round trip).
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        self.holders_of(resource).await
    }

    fn why_not_listing(&self) -> String {
        "Memcached cannot enumerate its keys".to_owned()
    }

    /// The stored limit and the slots held (one read of the limit, one pipelined read of the
    /// slots).
    async fn usage(&self, key: &Key) -> Result<crate::Usage> {
        self.sem_usage(key).await
    }

    async fn check(&self) -> Result<Vec<super::StoreWarning>> {
        self.check_server().await
    }

    /// Closes the idle connections; the next request opens a new one.
    async fn close(&self) -> Result<()> {
        self.inner.pool.close();
        Ok(())
    }
}
