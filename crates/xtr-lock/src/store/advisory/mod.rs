//! [`PgAdvisoryStore`]: PostgreSQL session-level advisory locks, shared with Symfony's
//! `PostgreSqlStore` in its key mode (see docs/advisory.md).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Capabilities, HandleOwner, HolderInfo, Holding, LossWatcher, LostReason, Saved, Store,
};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};

mod config;
mod conns;
mod keys;
mod session;

pub(crate) use config::is_advisory_dsn;
use conns::Conns;
pub use keys::KeyMode;
use session::{Cmd, Life, Session};

/// Checks an advisory DSN without building anything.
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
///   the store's small control pool (the same role may always cancel its own backends); if the
///   cancel crossed the grant, the lock is unlocked again. A wait that cannot be cancelled
///   (the server stops answering) ends with its connection closed.
/// - **Liveness**: a holder that dies closes its connection, and the server frees its locks at
///   once (a partitioned client's only when the server's TCP keepalive gives up). Each holding
///   session is pinged (`keepalive`, 1 s); a session that ends (terminated, server restarted,
///   connection broken) is reported lost through the loss watcher.
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
///     lock.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgAdvisoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    conns: Arc<Conns>,
    owner: HandleOwner,
    shown: Arc<str>,
}

/// What a holder keeps on its key: its session, started on its first acquire.
#[derive(Default)]
struct Handle {
    session: Mutex<Option<Session>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PgAdvisoryStore {
    /// A store from a DSN: `postgresql+advisory://[user[:password]@]host[:port]/database`
    /// (Symfony's scheme; `postgres+advisory://` too), with this library's options `keys`
    /// (`sha256`, the default, or `crc32` for Symfony's keys), `keepalive` (seconds between
    /// pings of a holding session, 1), `connect_timeout` and `statement_timeout` (5 s each: a
    /// statement that does not wait for a lock and gets no answer in it closes its session),
    /// `max_idle` (idle lock connections kept, 16); every other option (`sslmode`, …) goes to
    /// the driver. Connects lazily.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming what is wrong
    /// (never a credential).
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        let config = config::parse(dsn)?;
        let shown: Arc<str> = config.shown.clone().into();
        Ok(PgAdvisoryStore {
            inner: Arc::new(Inner {
                conns: Arc::new(Conns::new(config)),
                owner: HandleOwner::new(),
                shown,
            }),
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
        let handle = key.existing_handle::<Handle>(self.inner.owner)?;
        let guard = lock(&handle.session);
        let session = guard.as_ref()?;
        let life = *session.life.borrow();
        life.held?;
        life.pid
    }

    fn sender(&self, key: &Key) -> tokio::sync::mpsc::UnboundedSender<Cmd> {
        let handle = key.handle::<Handle>(self.inner.owner);
        let mut guard = lock(&handle.session);
        match guard.as_ref() {
            Some(s) if !s.tx.is_closed() => s.tx.clone(),
            _ => {
                let session = session::start(
                    self.inner.conns.clone(),
                    self.advisory_key(key.resource()),
                    key.resource().to_owned(),
                    self.inner.shown.clone(),
                );
                let tx = session.tx.clone();
                *guard = Some(session);
                tx
            }
        }
    }

    fn existing_sender(&self, key: &Key) -> Option<tokio::sync::mpsc::UnboundedSender<Cmd>> {
        let handle = key.existing_handle::<Handle>(self.inner.owner)?;
        let guard = lock(&handle.session);
        guard.as_ref().map(|s| s.tx.clone())
    }

    async fn ask<T>(
        &self,
        key: &Key,
        tx: tokio::sync::mpsc::UnboundedSender<Cmd>,
        cmd: impl FnOnce(tokio::sync::oneshot::Sender<Result<T>>) -> Cmd,
    ) -> Result<T> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let gone = || {
            Error::storage("the holder's session task stopped")
                .with_resource(key.resource())
                .with_store(self)
        };
        tx.send(cmd(reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    async fn save_mode(&self, key: &Key, mode: Mode, wait: bool) -> Result<Saved> {
        key.mark_unserializable();
        let tx = self.sender(key);
        self.ask(key, tx, |reply| Cmd::Save { mode, wait, reply })
            .await
    }
}

#[async_trait]
impl Store for PgAdvisoryStore {
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
        }
    }

    /// # Cancel safety
    ///
    /// Dropped mid-flight, the holder's session finishes the statement and unlocks what it
    /// granted; `delete` removes what an answered save stored.
    async fn save(&self, key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        self.save_mode(key, Mode::Write, false).await
    }

    /// # Cancel safety
    ///
    /// As [`save`](Store::save).
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
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    async fn put_off_expiration(&self, key: &Key, _ttl: Duration) -> Result<Holding> {
        self.exists(key).await
    }

    /// # Cancel safety
    ///
    /// Dropped mid-flight, the unlocks still run to the end in the holder's session.
    async fn delete(&self, key: &Key) -> Result<bool> {
        match self.existing_sender(key) {
            Some(tx) => self.ask(key, tx, |reply| Cmd::Release { reply }).await,
            None => Ok(false),
        }
    }

    /// Asks the holder's session which holds `pg_locks` shows for it (one round trip).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    async fn exists(&self, key: &Key) -> Result<Holding> {
        match self.existing_sender(key) {
            Some(tx) => self.ask(key, tx, |reply| Cmd::Check { reply }).await,
            None => Ok(Holding::NotHeld(LostReason::Removed)),
        }
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: it registers nothing.
    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        let life = key
            .existing_handle::<Handle>(self.inner.owner)
            .and_then(|h| lock(&h.session).as_ref().map(|s| s.life.clone()));
        let Some(mut life) = life else {
            return Ok(Some(LossWatcher::new(async { LostReason::Removed })));
        };
        let start = *life.borrow();
        Ok(Some(LossWatcher::new(async move {
            loop {
                let now: Life = *life.borrow_and_update();
                if now.held.is_none() || now.ended != start.ended {
                    return now.lost.unwrap_or(LostReason::Removed);
                }
                if life.changed().await.is_err() {
                    // The session task is gone (its runtime ended): so is its connection.
                    return LostReason::Disconnected;
                }
            }
        })))
    }

    /// Every backend that holds `resource`'s key in this database, from `pg_locks`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let (classid, objid) = keys::pg_locks_ids(self.advisory_key(resource));
        let pool = self.inner.conns.control();
        let rows = sqlx::query_as::<_, (i32, String, Option<String>, Option<String>)>(
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
        let rows = tokio::time::timeout(self.inner.conns.config.statement_timeout, rows)
            .await
            .map_err(|_| {
                Error::storage("cannot reach the database: no answer within the statement timeout")
                    .temporary()
            })
            .and_then(|r| {
                r.map_err(|e| Error::storage(format!("cannot read pg_locks: {e}")).temporary())
            })
            .map_err(|e| e.with_resource(resource).with_store(self))?;
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

    /// Closes the idle connections and the control pool; holders keep their sessions.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, some connections may stay open; calling it again closes them.
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
