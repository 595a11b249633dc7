//! Database session locks: [`PgAdvisoryStore`] (PostgreSQL session-level advisory locks, shared
//! with Symfony's `PostgreSqlStore` in its key mode) and [`MySqlLockStore`] (MySQL/MariaDB
//! `GET_LOCK`), both on a session per holder (see docs/session-locks.md).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::{Capabilities, HolderInfo, Holding, LossWatcher, Saved, Store};
use crate::error::Result;
use crate::key::{Key, Mode};

mod cancel;
mod config;
mod conns;
mod db;
mod getlock;
mod keys;
mod outcome;
mod session;
mod shared;

use conns::{Conns, Control};
use db::LockId;
pub use getlock::MySqlLockStore;
pub use keys::KeyMode;
use shared::Core;

/// Why neither session store counts (see docs/semaphores.md): a semaphore would be N keys
/// tried in turn, which can only be waited for by polling, cannot keep a weighted holder from
/// being overtaken, and has nowhere to keep the limit.
pub(crate) const WHY_NOT_COUNTING: &str = "a session lock has one holder and no count: N keys \
     tried in turn would wait by polling, let single holders starve a weighted one and keep \
     no limit (use the sql store's semaphores on the same database)";

/// Checks a session-lock DSN (advisory or `GET_LOCK`) without building anything.
pub(crate) fn validate_dsn(dsn: &str) -> Result<()> {
    config::parse(dsn).map(|_| ())
}

/// Locks that are PostgreSQL session-level advisory locks (`pg_advisory_lock` and its shared
/// and trying forms), held by a database session that belongs to the holder for as long as it
/// holds.
///
/// - **A session per holder**: each holder's lock statements run, in order, on a connection of
///   its own, owned by a task of this store. A connection goes back to the store's idle list
///   (for the next holder) only after its holder's unlocks have all answered that they
///   unlocked; one in any doubt is closed, which frees everything its session held. Never
///   behind a pooler that breaks session affinity (PgBouncer in transaction or statement
///   mode): the lock would be taken on one server session and released on another.
/// - **Keys**: one `bigint` per resource, in one database (advisory locks are per database).
///   By default the first 8 bytes of the resource's SHA-256, big-endian; with `?keys=crc32`
///   Symfony's CRC-32 keys, so Rust and PHP processes on Symfony's `PostgreSqlStore` share
///   locks, with the 32-bit space's collisions ([`KeyMode`]). The two modes do not exclude each
///   other: choose one per set of resources.
/// - **Shared locks** are native (`ShareLock`). A reader promotes with a try for the write lock,
///   keeping its read lock until the write lock is granted; a refused promotion still reads. A
///   waiting promotion that deadlocks with another reader promoting at once (the server
///   aborts one after its `deadlock_timeout`) is a conflict error, the read lock still held.
///   A writer demotes by taking the read lock (granted at once: it goes ahead of waiters) and
///   then letting the write lock go.
/// - **Native waits** in the server, woken by the holder's unlock. A wait whose caller gives up
///   (a deadline, a dropped future) is cancelled with `pg_cancel_backend` on a connection of
///   the store's small control pool (the same role may always cancel its own backends),
///   repeated until the wait answers (a request that arrives before the server has started the
///   statement finds nothing to cancel); if the cancel crossed the grant, the lock is unlocked
///   again. A wait that stays unanswered for the statement timeout (the server is paused) ends
///   with its connection closed.
/// - **Liveness**: a holder that dies closes its connection, and the server frees its locks at
///   once (a partitioned client's only when the server's TCP keepalive gives up). Each holding
///   session is pinged (`keepalive`, 1 s, at most 60 s, and at least three times within the
///   time the server lets a silent client live, below); a session that ends (terminated,
///   server restarted, connection broken) is reported lost through the loss watcher.
/// - **A silent holder's lock can be taken**: the server ends the session of a client cut off
///   by a partition when its TCP keepalive gives up (`tcp_keepalives_idle` +
///   `tcp_keepalives_interval` × `tcp_keepalives_count`: 2 h 11 min with Linux's defaults), and
///   that of a client stopped with SIGSTOP after `idle_session_timeout` if the server sets one
///   (PostgreSQL 14 and later; off by default). The lock is free from then on. The store reads
///   these per session (the keepalive as the server applies it to the socket), and
///   [`Store::lease_remaining`] answers how long the lock certainly lasts: the last round trip
///   the server answered on the holder's session, plus the shorter of the two, less 1 s;
///   `Duration::MAX` while held when the server ends neither (a Unix socket without
///   `idle_session_timeout`).
/// - **No expiry, no fencing**: ttls are ignored; there is no counter to fence with.
/// - **Introspection** from `pg_locks`: every backend holding the key, its pid, mode and
///   client.
///
/// Keys hold a session and refuse to serialize.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::{LockFactory, Lockable as _, PgAdvisoryStore};
///
/// let store = PgAdvisoryStore::from_dsn("postgresql+advisory://app:secret@db/app")?;
/// let factory = LockFactory::new(store);
/// let lock = factory.create_lock("nightly-report");
/// if lock.try_acquire().await? {
///     // ... the work; the lock goes the moment this process's session ends ...
///     let _ = lock.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgAdvisoryStore {
    inner: std::sync::Arc<Core>,
}

impl PgAdvisoryStore {
    /// A store from a DSN: `postgresql+advisory://[user[:password]@]host[:port]/database`
    /// (Symfony's scheme; `postgres+advisory://` too), with this library's options `keys`
    /// (`sha256`, the default, or `crc32` for Symfony's keys), `keepalive` (seconds between
    /// pings of a holding session, 1, at most 60), `connect_timeout` and `statement_timeout`
    /// (5 s each: a statement that does not wait for a lock and gets no answer in it closes its
    /// session), `max_idle` (idle lock connections kept, 16); the driver's own options
    /// (`sslmode`, …) go to it, and any other option is refused, naming it. Connects lazily.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming what is wrong
    /// (never a credential), also for a `mysql+getlock://` DSN.
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        let config = config::parse(dsn)?;
        if !matches!(config.target, db::Target::Postgres(_)) {
            return Err(crate::error::Error::invalid_argument(
                "PgAdvisoryStore: write postgresql+advisory://user:password@host:port/database",
            ));
        }
        Ok(PgAdvisoryStore {
            inner: std::sync::Arc::new(Core::new(Conns::new(config))),
        })
    }

    /// How this store maps resources to advisory keys.
    pub fn key_mode(&self) -> KeyMode {
        self.inner.conns.config.keys
    }

    /// The advisory key `resource` locks (`pg_locks` shows its upper 32 bits as `classid`, its
    /// lower as `objid`, with `objsubid = 1`).
    pub fn advisory_key(&self, resource: &str) -> i64 {
        self.key_mode().key(resource)
    }

    /// The backend pid of the session holding `key`'s lock, while it holds.
    pub fn backend_pid(&self, key: &Key) -> Option<i32> {
        self.inner
            .session_id(key)
            .and_then(|pid| i32::try_from(pid).ok())
    }

    async fn save_mode(&self, key: &Key, mode: Mode, wait: bool) -> Result<Saved> {
        let id = || LockId::Advisory(self.advisory_key(key.resource()));
        self.inner.save(key, id, mode, wait).await
    }
}

#[async_trait]
impl Store for PgAdvisoryStore {
    fn why_not_counting(&self) -> String {
        WHY_NOT_COUNTING.to_owned()
    }

    /// `pg_locks` shows the held keys, but a key is a hash of its resource and the store keeps
    /// no table of names (nor of metadata) beside the session's lock.
    fn why_not_listing(&self) -> String {
        "advisory locks are numbers (hashes of the resources) in pg_locks, and the store keeps \
         no table of their names"
            .to_owned()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: true,
            shared: true,
            blocking: true,
            blocking_shared: true,
            expiring: false,
            fencing: false,
            notifies: false,
            serializable_keys: false,
            introspection: true,
            liveness: true,
            observes_loss: true,
            leased: true,
            counting: false,
            metadata: false,
            lists: false,
            fair: true,
        }
    }

    async fn save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.save_mode(key, Mode::Write, false).await
    }

    async fn save_read(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.save_mode(key, Mode::Read, false).await
    }

    /// # Cancel safety
    ///
    /// Dropped while waiting, the server-side wait is cancelled; a grant that crossed the
    /// cancel is unlocked again, and a read lock held before a promotion stays held.
    async fn wait_and_save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.save_mode(key, Mode::Write, true).await
    }

    /// # Cancel safety
    ///
    /// As [`wait_and_save`](Store::wait_and_save).
    async fn wait_and_save_read(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.save_mode(key, Mode::Read, true).await
    }

    /// Checks the hold (nothing expires).
    async fn put_off_expiration(&self, key: &Key, _ttl: Duration) -> Result<Holding> {
        self.exists(key).await
    }

    async fn delete(&self, key: &Key) -> Result<bool> {
        self.inner.delete(key).await
    }

    /// Asks the holder's session which holds `pg_locks` shows for it (one round trip).
    async fn exists(&self, key: &Key) -> Result<Holding> {
        self.inner.exists(key).await
    }

    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        Ok(Some(self.inner.watch_loss(key)))
    }

    /// Every backend that holds `resource`'s key in this database, from `pg_locks`.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let (classid, objid) = keys::pg_locks_ids(self.advisory_key(resource));
        let Control::Postgres(pool) = self.inner.conns.control() else {
            unreachable!("an advisory store's control pool is PostgreSQL's");
        };
        let query = sqlx::query_as::<_, (i32, String, Option<String>, Option<String>)>(
            "SELECT l.pid, l.mode, a.application_name, host(a.client_addr) FROM pg_locks l \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.objsubid = 1 \
             ORDER BY l.pid",
        )
        .bind(classid)
        .bind(objid)
        .fetch_all(&pool);
        let rows = self.inner.inspect(resource, "pg_locks", query).await?;
        Ok(rows
            .into_iter()
            .map(|(pid, mode, app, client)| {
                let mode = if mode == "ShareLock" {
                    Mode::Read
                } else {
                    Mode::Write
                };
                let mut backend = format!("backend {pid}");
                if let Some(app) = app.filter(|a| !a.is_empty()) {
                    backend.push_str(&format!(" ({app}"));
                    backend.push_str(&match client {
                        Some(c) => format!(", from {c})"),
                        None => ", local socket)".to_owned(),
                    });
                }
                HolderInfo::new(mode, None, None).with_backend(backend)
            })
            .collect())
    }

    /// The last round trip the server answered on the holder's session, plus how long the
    /// server keeps a silent client's session (see the store's `# Failure modes`).
    fn lease_remaining(&self, key: &Key) -> Option<Duration> {
        self.inner.lease_remaining(key)
    }

    /// Closes the idle connections and the control pool; holders keep their sessions.
    async fn close(&self) -> Result<()> {
        self.inner.conns.close().await;
        Ok(())
    }

    fn locks_in(&self) -> Option<String> {
        // The key mode is part of where: the two modes are two key spaces.
        let shown = &self.inner.shown;
        Some(if self.key_mode() == KeyMode::Crc32 {
            shown.to_string()
        } else {
            format!("{shown}?keys=sha256")
        })
    }

    fn location(&self, resource: &str) -> Option<String> {
        let key = self.advisory_key(resource);
        let (classid, objid) = keys::pg_locks_ids(key);
        Some(format!(
            "advisory key {key} (pg_locks classid={classid} objid={objid} objsubid=1)"
        ))
    }
}

impl fmt::Display for PgAdvisoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.shown)
    }
}

impl fmt::Debug for PgAdvisoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgAdvisoryStore")
            .field("store", &&*self.inner.shown)
            .field("keys", &self.key_mode())
            .finish_non_exhaustive()
    }
}
