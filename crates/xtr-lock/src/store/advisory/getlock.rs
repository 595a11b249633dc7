//! [`MySqlLockStore`]: MySQL/MariaDB named locks (`GET_LOCK`) on a session per holder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::conns::{Conns, Control};
use super::db::LockId;
use super::shared::Core;
use super::{config, keys};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::store::{Capabilities, HolderInfo, Holding, LossWatcher, Saved, Store};

/// Locks that are MySQL/MariaDB named locks (`GET_LOCK` / `RELEASE_LOCK`), held by a database
/// session that belongs to the holder for as long as it holds.
///
/// - **A session per holder**, as [`PgAdvisoryStore`](crate::PgAdvisoryStore): a holder's
///   statements run in order on a connection of its own; it goes back to the store's idle list
///   only after `RELEASE_LOCK` answered that it released, and is closed in any doubt (the end
///   of the session frees its locks). Never behind a proxy that multiplexes sessions.
/// - **Names**: MySQL's lock names are server-wide and at most 64 characters, and compared
///   case-insensitively by some servers and not by others. A resource locks
///   `xtr-lock:` followed by the first 55 hex digits of the SHA-256 of the database's name, a
///   NUL byte and the resource ([`lock_name`](MySqlLockStore::lock_name)): any resource fits,
///   `Invoice` and `invoice` stay apart, and two databases on one server do not share locks.
///   Other programs can take the same lock with that name (in SQL:
///   `CONCAT('xtr-lock:', LEFT(SHA2(CONCAT('app', CHAR(0), 'resource'), 256), 55))`).
/// - **Exclusive only**: `GET_LOCK` has no shared mode, so a read lock is taken as a write
///   lock.
/// - **Native waits** in the server (`GET_LOCK` with a long timeout), woken by the holder's
///   `RELEASE_LOCK`. A wait whose caller gives up is killed with `KILL QUERY` on a connection of
///   the store's control pool (a user may always kill its own statements), repeated until the
///   wait answers; a grant that crossed the kill is released again, and a wait unanswered for
///   the statement timeout ends with its connection closed.
/// - **Liveness**: a holder that dies closes its connection and the server frees its locks;
///   each holding session is pinged (`keepalive`, 1 s, at most 60 s, and at least three
///   times within `wait_timeout`), and one that ends
///   (`KILL`, a restart, a broken connection) is reported lost through the loss watcher.
/// - **A silent holder's lock can be taken**: the server ends the idle session of a client that
///   stopped talking after `wait_timeout` (8 h by default; a holder stopped with SIGSTOP), and
///   the session of a client cut off by a partition when its TCP keepalive gives up (the
///   server's operating system's settings, which a client cannot read: Linux's defaults, 2 h
///   11 min, are assumed). The lock is free from then on. [`Store::lease_remaining`] answers
///   how long it certainly lasts: the last round trip the server answered on the holder's
///   session, plus the shorter of the two (`wait_timeout` read per session), less 1 s.
/// - **No expiry, no fencing**: ttls are ignored.
/// - **Introspection** with `IS_USED_LOCK`: the holding connection's id, user and host.
///
/// MySQL 5.7 or later, or MariaDB 10.0.2 or later (one session may hold several named locks).
/// Keys hold a session and refuse to serialize.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::{LockFactory, Lockable as _, MySqlLockStore};
///
/// let store = MySqlLockStore::from_dsn("mysql+getlock://app:secret@db/app")?;
/// let factory = LockFactory::new(store);
/// let lock = factory.create_lock("nightly-report");
/// if lock.try_acquire().await? {
///     // ... the work; the lock goes the moment this process's session ends ...
///     let _ = lock.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MySqlLockStore {
    inner: Arc<Core>,
}

impl MySqlLockStore {
    /// A store from a DSN: `mysql+getlock://[user[:password]@]host[:port]/database`
    /// (`mariadb+getlock://` too; the database is required: it goes into every lock's name),
    /// with this library's options `keepalive` (seconds between pings of a holding session, 1,
    /// at most 60), `connect_timeout` and `statement_timeout` (5 s each), `max_idle` (idle lock
    /// connections kept, 16); the driver's own options (`ssl-mode`, …) go to it, and any other
    /// option is refused, naming it. Connects lazily.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming what is wrong
    /// (never a credential).
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        let config = config::parse(dsn)?;
        if !matches!(config.target, super::db::Target::MySql(_)) {
            return Err(Error::invalid_argument(
                "MySqlLockStore: write mysql+getlock://user:password@host:port/database",
            ));
        }
        Ok(MySqlLockStore {
            inner: Arc::new(Core::new(Conns::new(config))),
        })
    }

    /// The lock name `resource` takes with `GET_LOCK`.
    pub fn lock_name(&self, resource: &str) -> String {
        keys::getlock_name(&self.inner.conns.config.database, resource)
    }

    /// The connection id (`CONNECTION_ID()`) of the session holding `key`'s lock, while it
    /// holds.
    pub fn connection_id(&self, key: &Key) -> Option<u64> {
        self.inner
            .session_id(key)
            .and_then(|id| u64::try_from(id).ok())
    }

    async fn save_write(&self, key: &Key, wait: bool) -> Result<Saved> {
        let id = || LockId::Named(self.lock_name(key.resource()));
        self.inner.save(key, id, Mode::Write, wait).await
    }
}

#[async_trait]
impl Store for MySqlLockStore {
    fn why_not_counting(&self) -> String {
        super::WHY_NOT_COUNTING.to_owned()
    }

    /// Named locks are kept only in the server's memory, under hashed names, and a session
    /// holding one has nowhere to put metadata.
    fn why_not_listing(&self) -> String {
        "MySQL/MariaDB enumerate GET_LOCK locks only through performance_schema (off by \
         default on MariaDB) or the metadata_lock_info plugin, and the lock names are hashes \
         of the resources"
            .to_owned()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: true,
            shared: false,
            blocking: true,
            blocking_shared: false,
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
            fair: false,
        }
    }

    async fn save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.save_write(key, false).await
    }

    /// # Cancel safety
    ///
    /// Dropped while waiting, the server-side wait is killed; a grant that crossed the kill is
    /// released again.
    async fn wait_and_save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.save_write(key, true).await
    }

    /// Checks the hold (nothing expires).
    async fn put_off_expiration(&self, key: &Key, _ttl: Duration) -> Result<Holding> {
        self.inner.exists(key).await
    }

    async fn delete(&self, key: &Key) -> Result<bool> {
        self.inner.delete(key).await
    }

    /// Asks the holder's session whether `IS_USED_LOCK` names it (one round trip).
    async fn exists(&self, key: &Key) -> Result<Holding> {
        self.inner.exists(key).await
    }

    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        Ok(Some(self.inner.watch_loss(key)))
    }

    /// The session holding `resource`'s lock on the server, from `IS_USED_LOCK`, with its user
    /// and host where the process list shows them.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let Control::MySql(pool) = self.inner.conns.control() else {
            unreachable!("a GET_LOCK store's control pool is MySQL's");
        };
        // Cast: the servers disagree on the type of IS_USED_LOCK (INT on MariaDB).
        let query = sqlx::query_as::<_, (Option<i64>, Option<String>, Option<String>)>(
            "SELECT l.id, p.USER, p.HOST FROM (SELECT CAST(IS_USED_LOCK(?) AS SIGNED) AS id) l \
             LEFT JOIN information_schema.PROCESSLIST p ON p.ID = l.id",
        )
        .bind(self.lock_name(resource))
        .fetch_one(&pool);
        let (id, user, host) = self.inner.inspect(resource, "IS_USED_LOCK", query).await?;
        Ok(id
            .map(|id| {
                let mut backend = format!("connection {id}");
                if let (Some(user), Some(host)) = (user, host) {
                    backend.push_str(&format!(" ({user}@{host})"));
                }
                HolderInfo::new(Mode::Write, None, None).with_backend(backend)
            })
            .into_iter()
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
        Some(self.inner.shown.to_string())
    }

    fn location(&self, resource: &str) -> Option<String> {
        Some(format!("GET_LOCK name {}", self.lock_name(resource)))
    }
}

impl fmt::Display for MySqlLockStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.shown)
    }
}

impl fmt::Debug for MySqlLockStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlLockStore")
            .field("store", &&*self.inner.shown)
            .finish_non_exhaustive()
    }
}
