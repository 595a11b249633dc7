//! [`EtcdStore`]: locks on an etcd cluster, in the layout of etcd's own lock recipe (see
//! docs/etcd.md).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::GetOptions;
use tokio::sync::{mpsc, oneshot};

use super::{Capabilities, HolderInfo, Holding, Listing, LossWatcher, Saved, Store, Watcher};
use crate::error::{Error, LostReason, Result};
use crate::key::{Key, Mode};

mod clock;
mod config;
mod conn;
mod holder;
mod introspect;
mod lease;
mod listing;
mod members;
mod queue;
mod record;
mod semaphore;
mod watch;

use super::tasks::{self, Tasks};
use conn::Core;
use holder::{Cmd, Confirmed, Life};

/// Checks an etcd DSN without connecting.
pub(crate) fn validate_dsn(dsn: &str) -> Result<()> {
    config::parse(dsn).map(|_| ())
}

/// Locks on an etcd cluster: linearizable, FIFO, fenced by the cluster's revisions, and shared
/// with `etcdctl lock` and every client of etcd's `concurrency.Mutex`.
///
/// - **Layout**: a holder's key is `<prefix><resource>/<lease id in hex>`, on the holder's
///   lease, as etcd's recipe writes it; the owner is the key with the lowest create revision.
///   With no prefix, resource `NAME` is `etcdctl lock NAME`'s lock, in both directions.
/// - **Shared locks**: a reader's key is `<prefix><resource>/r-<lease hex>` with the value
///   `read`. A reader holds when no writer key is older; a writer when no key at all is older.
///   A reader that comes after a queued writer waits behind it: readers never starve writers.
///   `etcdctl lock` sees readers as keys before it and waits for them, so the two tools
///   exclude each other in both directions, readers included.
/// - **Promotion** puts a writer key beside the read key, which stays until the writer key
///   holds. When a writer is already queued (it waits for this holder's read key), waiting
///   would deadlock: the promotion gives way (a conflict, the read lock kept). **Demotion**
///   rewrites the writer key's value in place: it keeps its place, and the holder reads at
///   once.
/// - **FIFO waits** in order of create revision, each waiter watching only the key before it:
///   a release wakes one waiter. After waking, a waiter checks that its own key still exists;
///   one that vanished (its lease ended) is an error, never a grant.
/// - **Fencing tokens** are the cluster's revision at which the holder was seen to hold (its
///   key's create revision when it held at once): ordered by the cluster's log, and the same
///   number `etcdctl lock` exports as `ETCD_LOCK_REV`, so the two tools' tokens compare.
/// - **Leases**: one per hold (or wait), granted when a holder that has none queues a key,
///   with the lock's ttl (whole seconds, at least 1: a ttl that is not is refused; the DSN's
///   `ttl` when the lock has none, 60 s by default), kept alive by the store every third of it
///   while the holder holds or waits, and revoked as soon as it holds nothing (released, a try
///   refused, a wait given up): tried again until etcd answers, and
///   [`close`](Store::close) waits for it. The lock does not expire while its holder lives;
///   the ttl is how long the lock of a holder that died (or lost the cluster) outlives it. A
///   lease's ttl is fixed when it is granted: a refresh keeps the lease alive and cannot change
///   it. The lease's confirmed end is kept on the boot clock, which counts suspend.
/// - **Waits ride out a cluster that does not answer** (paused, cut off, without a quorum):
///   a waiter whose lease is not confirmed in time keeps its place if the lease proves
///   alive, and queues again at the back (with a new lease) if it does not. A holder's own
///   keys (any key on one of its leases, such as one whose delete did not land yet) never
///   make it wait; a delete that fails is tried again until it lands.
/// - **Loss**, reported at once through the loss watcher: the holder's key deleted (`etcdctl
///   del`), its lease revoked or expired, or no keep-alive answered by the end the last answered
///   one confirmed (its send time plus the ttl the cluster answered).
///
/// - **Counting semaphores**: a holder's key is `<prefix>xtr-semaphore/<resource>/<lease hex>`
///   (outside every lock's directory) with the value `limit=<limit> permits=<count>`; a key
///   holds when the permits of the keys before it and its own fit in the limit (FIFO: a big
///   waiter is not overtaken), and goes in only beside keys of the same limit. Waiters watch
///   the deletes before them; tokens are the keys' create revisions (docs/semaphores.md).
///
/// Keys hold a lease and refuse to serialize.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::{EtcdStore, LockFactory, Lockable as _};
///
/// let store = EtcdStore::from_dsn("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")?;
/// let lock = LockFactory::new(store).create_lock("nightly-report");
/// lock.acquire().await?;
/// let token = lock.fencing_token(); // the key's create revision
/// // ... the work, passing `token` to what it writes ...
/// let _ = lock.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdStore {
    core: Arc<Core>,
}

/// What a holder keeps on its key: its task, started on its first acquire, and where its
/// lease's keeper writes until when the lease certainly lasts.
#[derive(Default)]
struct Handle {
    task: Tasks<Cmd, Life>,
    confirmed: Confirmed,
}

impl EtcdStore {
    /// A store from a DSN: `etcd://[user[:password]@]host[:port][,host[:port]…][/prefix]`, or
    /// `etcds://` for TLS, with the options `ttl` (seconds: the lease of a lock without its
    /// own ttl, 60), `keepalive` (seconds between keep-alives, a third of the ttl),
    /// `connect_timeout` and `request_timeout` (5 s each), and for TLS `ca_file`, `cert_file`
    /// and `key_file`. The port defaults to 2379, the prefix to none (`etcdctl lock`'s
    /// layout). Connects on first use.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming what is wrong,
    /// never the password.
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        Ok(EtcdStore {
            core: Arc::new(Core::new(config::parse(dsn)?)),
        })
    }

    /// The lease of `key`'s holder, while it has one (as `etcdctl lease list` shows it, in
    /// decimal; keys carry it in hex).
    pub fn lease_id(&self, key: &Key) -> Option<i64> {
        self.life(key).and_then(|l| l.lease)
    }

    /// Where `resource`'s keys live: `<prefix><resource>/` (what `etcdctl lock` is given,
    /// without the slash).
    pub fn directory(&self, resource: &str) -> String {
        format!("{}{resource}/", self.core.config.prefix)
    }

    /// Where the keys of `resource`'s semaphore live: `<prefix>xtr-semaphore/<resource>/`,
    /// with `%` and `/` in the resource percent-encoded (outside every lock's directory).
    pub fn semaphore_directory(&self, resource: &str) -> String {
        String::from_utf8_lossy(&semaphore::dir(&self.core.config.prefix, resource)).into_owned()
    }

    fn life(&self, key: &Key) -> Option<Life> {
        key.existing_handle::<Handle>(self.core.owner)?.task.life()
    }

    fn existing_sender(&self, key: &Key) -> Option<mpsc::UnboundedSender<Cmd>> {
        key.existing_handle::<Handle>(self.core.owner)?
            .task
            .existing_sender()
    }

    async fn ask<T>(
        &self,
        key: &Key,
        tx: mpsc::UnboundedSender<Cmd>,
        cmd: impl FnOnce(oneshot::Sender<Result<T>>) -> Cmd,
    ) -> Result<T> {
        tasks::ask(tx, cmd, || {
            Error::storage("the holder's task stopped")
                .with_resource(key.resource())
                .with_store(&*self.core.shown)
        })
        .await
    }

    async fn save_mode(
        &self,
        key: &Key,
        mode: Mode,
        wait: bool,
        ttl: Option<Duration>,
    ) -> Result<Saved> {
        if let Some(ttl) = ttl {
            config::lease_ttl(ttl).map_err(|e| {
                e.with_resource(key.resource())
                    .with_store(&*self.core.shown)
            })?;
        }
        if key.permits().is_none() {
            record::refuse_reserved(key.resource()).map_err(|e| e.with_store(&*self.core.shown))?;
            if mode == Mode::Write {
                record::writer_value(key.meta().as_deref()).map_err(|e| {
                    e.with_resource(key.resource())
                        .with_store(&*self.core.shown)
                })?;
            }
        }
        key.mark_unserializable();
        let handle = key.handle::<Handle>(self.core.owner);
        let tx = handle.task.sender(|| {
            holder::start(
                self.core.clone(),
                key.resource().to_owned(),
                handle.confirmed.clone(),
                key.permits(),
            )
        });
        self.ask(key, tx, |reply| Cmd::Save {
            mode,
            wait,
            ttl,
            meta: key.meta(),
            reply,
        })
        .await
    }

    async fn check(&self, key: &Key, refresh: bool) -> Result<Holding> {
        match self.existing_sender(key) {
            Some(tx) => {
                self.ask(key, tx, |reply| Cmd::Check { refresh, reply })
                    .await
            }
            None => Ok(Holding::NotHeld(LostReason::Removed)),
        }
    }
}

#[async_trait]
impl Store for EtcdStore {
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
            liveness: false,
            observes_loss: true,
            leased: true,
            counting: true,
            metadata: true,
            lists: true,
            fair: true,
        }
    }

    /// Puts the holder's queue key and reads the queue in one transaction (plus a lease grant
    /// on the holder's first acquire); a key that does not hold at once is deleted again.
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        self.save_mode(key, Mode::Write, false, ttl).await
    }

    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        super::refuse_shared_permits(key)?;
        self.save_mode(key, Mode::Read, false, ttl).await
    }

    /// Queues and waits for the key before this one to go, however long; keeps its place
    /// through leader changes and broken connections while its lease lives.
    ///
    /// # Cancel safety
    ///
    /// Dropped while waiting, the queue key is deleted (a promotion's read lock stays); a grant
    /// that crossed the drop is given back.
    async fn wait_and_save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        self.save_mode(key, Mode::Write, true, ttl).await
    }

    /// # Cancel safety
    ///
    /// As [`wait_and_save`](Store::wait_and_save).
    async fn wait_and_save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        super::refuse_shared_permits(key)?;
        self.save_mode(key, Mode::Read, true, ttl).await
    }

    /// Keeps the lease alive now (one keep-alive) and checks the key. The lease's ttl cannot
    /// change: `ttl` is ignored (the store keeps the lease alive anyway).
    async fn put_off_expiration(&self, key: &Key, _ttl: Duration) -> Result<Holding> {
        self.check(key, true).await
    }

    /// Deletes the holder's key (only that key: never another holder's). Its lease, which
    /// then holds nothing, is revoked right after (with any key of the holder's left on it):
    /// [`close`](Store::close) waits for that.
    async fn delete(&self, key: &Key) -> Result<bool> {
        match self.existing_sender(key) {
            Some(tx) => self.ask(key, tx, |reply| Cmd::Release { reply }).await,
            None => Ok(false),
        }
    }

    /// Moves the holder's key (and its record) onto a lease of its own of `after` rounded up
    /// to whole seconds (etcd's minimum ttl if that is more), which nobody keeps alive, in one
    /// transaction that compares the key's create revision: the lock ends on the cluster's
    /// clock when that lease does. The holder's own lease is revoked, as after a release.
    /// Not held when the key is no longer the holder's.
    async fn release_after(&self, key: &Key, after: Duration) -> Result<Option<Holding>> {
        match self.existing_sender(key) {
            Some(tx) => self
                .ask(key, tx, |reply| Cmd::ReleaseAfter { after, reply })
                .await
                .map(Some),
            None => Ok(Some(Holding::NotHeld(LostReason::Removed))),
        }
    }

    /// Reads the holder's key (one linearizable read).
    async fn exists(&self, key: &Key) -> Result<Holding> {
        self.check(key, false).await
    }

    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        Ok(Some(match key.existing_handle::<Handle>(self.core.owner) {
            // A holder task that is gone took its lease with it.
            Some(handle) => handle.task.loss_watcher(LostReason::Expired),
            None => LossWatcher::new(async { LostReason::Removed }),
        }))
    }

    /// The whole queue in order: holders first, then waiters ([`HolderInfo::waiting`]), each
    /// with its lease and the revision it queued at (`backend`: `lease 694d7a3b2c1f0a12, queued
    /// at revision 42`, with the key's name when it is not in this library's layout), the
    /// lease's remaining ttl, and what its record says (metadata, when it acquired, its token;
    /// a writer's metadata is its key's value, a peer's too). One transaction reads the queue
    /// and the records.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        self.lock_holders(resource).await
    }

    /// The semaphore's queue read once (with its records): the permits of the keys at its
    /// front that fit in the limit are held (each holder with its lease and remaining ttl);
    /// the limit is the first key's (every key has it: a holder of another limit is refused).
    async fn usage(&self, key: &Key) -> Result<crate::Usage> {
        let Some(permits) = key.permits() else {
            return Err(self.unsupported(key, "usage of a lock's key"));
        };
        self.semaphore_usage(key.resource(), permits.limit()).await
    }

    /// Every lock (ours and `etcdctl lock`/`elect`'s) and semaphore whose name starts with
    /// `prefix` and that somebody holds, waiters included ([`HolderInfo::waiting`]): the keys
    /// under `<prefix>` (and the semaphores' and records' namespaces) read in pages at one
    /// revision.
    async fn list(&self, prefix: &str) -> Result<Vec<Listing>> {
        self.list_held(prefix).await
    }

    /// An etcd watch on the resource's directory, registered before this returns: wakes on
    /// the next put or delete of a key in it (an acquisition, a release, a waiter queueing or
    /// leaving, a value rewritten as by Go's `Proclaim`). Registers nothing in the queue.
    async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
        let dir = queue::dir(&self.core.config.prefix, resource);
        let watcher = watch::changes(&self.core, dir)
            .await
            .map_err(|e| e.with_resource(resource))?;
        Ok(Some(watcher))
    }

    /// The cluster's revision now: every later acquisition's key gets a greater one.
    async fn fencing_counter(&self, resource: &str) -> Result<Option<u64>> {
        let dir = queue::dir(&self.core.config.prefix, resource);
        let got = self
            .core
            .get(&dir, GetOptions::new().with_prefix().with_count_only())
            .await
            .map_err(|e| e.with_resource(resource))?;
        Ok(got.header().and_then(|h| u64::try_from(h.revision()).ok()))
    }

    /// Waits for the revokes of leases that hold nothing (released holds, waits given up)
    /// to land, at most the request timeout, then drops the store's connection. Holds still
    /// held keep their leases (kept alive while their holders live; after that, their ttl).
    async fn close(&self) -> Result<()> {
        self.core
            .await_revokes(self.core.config.request_timeout)
            .await;
        self.core.disconnect().await;
        Ok(())
    }

    fn lease_remaining(&self, key: &Key) -> Option<Duration> {
        let handle = key.existing_handle::<Handle>(self.core.owner)?;
        handle.task.life()?.held?;
        holder::lease_remaining(&handle.confirmed)
    }

    fn locks_in(&self) -> Option<String> {
        Some(self.core.shown.to_string())
    }

    fn location(&self, resource: &str) -> Option<String> {
        Some(format!(
            "etcd keys under {:?} (etcdctl lock {:?})",
            self.directory(resource),
            format!("{}{resource}", self.core.config.prefix)
        ))
    }
}

impl fmt::Display for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.core.shown)
    }
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.core.config)
            .finish_non_exhaustive()
    }
}
