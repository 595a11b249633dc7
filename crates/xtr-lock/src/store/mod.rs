//! The store side: the one object-safe [`Store`] trait, its [`Capabilities`], and the stores.
//!
//! A store speaks persistence primitives (save, save_read, put_off_expiration, delete, exists,
//! native waits, change notifications). The [`Lock`](crate::Lock) speaks to users: it waits,
//! retries, refreshes, and emulates what a store lacks, as its capabilities say.
//!
//! # Implementing a store
//!
//! - Report what you do natively in [`capabilities`](Store::capabilities); leave the methods
//!   you do not support on their default, which returns an
//!   [`Unsupported`](crate::ErrorKind::Unsupported) error.
//! - Identify holders by the state on the [`Key`] ([`Key::token`]), never by the resource.
//! - Answer with outcomes, not errors: a save refused because someone else holds the lock is
//!   [`Saved::Conflict`] (saying when the current holders' leases end, if you know, and what the
//!   holder still holds); [`exists`](Store::exists) and
//!   [`put_off_expiration`](Store::put_off_expiration) say the mode held or why nothing is
//!   ([`Holding`]). [`Error`] is for failures.
//! - What a holder keeps while it holds beyond its token (an open file, a connection, a lease)
//!   goes in a handle on the key ([`Key::handle`]), under your store's [`HandleOwner`]: torn
//!   down by `delete`, and by its own `Drop` when the key goes (see `docs/holders-and-loss.md`).
//! - Where you can see a holder's lock go (a closed connection, a replaced file), say so with
//!   [`watch_loss`](Store::watch_loss) and `observes_loss`.
//! - With lifetimes: shorten the key's lifetime ([`Key::reduce_lifetime`]) **before** the round
//!   trip, and call [`check_expiry`] once the store has confirmed.
//! - `Display` is a short id without credentials; errors name the store by it.
//! - A key with [`Permits`](crate::Permits) ([`Key::permits`]) is a semaphore's holder: with
//!   [`Capabilities::counting`], every method works on it as on a lock's key (`save` takes its
//!   permits or answers a conflict when too few are free; the `Mode` is always `Write`; a
//!   limit other than the one the current holders use is an invalid argument,
//!   [`Permits::limit_mismatch`](crate::Permits::limit_mismatch)); keep semaphores apart from
//!   locks of the same name. Without it, a [`Semaphore`](crate::Semaphore) never reaches you.
//! - Run the conformance suite (feature `conformance`) on your store.

use std::fmt;
#[cfg(unix)]
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::key::Key;

mod channels;
mod combined;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
#[cfg(all(feature = "flock", target_os = "linux"))]
pub(crate) mod flock;
#[cfg(any(feature = "sql", feature = "memcached"))]
mod held;
#[cfg(feature = "memcached")]
pub(crate) mod memcached;
mod memory;
mod null;
mod outcome;
#[cfg(feature = "redis")]
pub(crate) mod pubsub;
#[cfg(all(feature = "semaphore", target_os = "linux"))]
pub(crate) mod semaphore;
#[cfg(any(feature = "sql", feature = "etcd"))]
mod tasks;
mod warning;
mod watch;

/// Re-exported so store implementors need no direct dependency on `async-trait`.
pub use async_trait::async_trait;
#[cfg(feature = "sql")]
pub(crate) mod advisory;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "sql")]
pub(crate) mod sql;

pub use crate::meta::HolderRecord;
#[cfg(feature = "sql")]
pub use advisory::{KeyMode, MySqlLockStore, PgAdvisoryStore};
pub use combined::{CombinedStore, ConsensusStrategy, Strategy, UnanimousStrategy};
#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;
#[cfg(all(feature = "flock", target_os = "linux"))]
pub use flock::FlockStore;
#[cfg(feature = "memcached")]
pub use memcached::MemcachedStore;
pub use memory::InMemoryStore;
pub use null::NullStore;
pub use outcome::{Acquired, Conflict, HolderInfo, Holding, Listing, Saved, Usage};
#[cfg(feature = "redis")]
pub use pubsub::RedisPubSubStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;
#[cfg(all(feature = "semaphore", target_os = "linux"))]
pub use semaphore::{SemaphoreStore, counting_semaphore_key, semaphore_key};
#[cfg(feature = "sql")]
pub use sql::{SqlStore, key_id as sql_key_id};
pub use warning::{Severity, StoreWarning};
pub use watch::{LossWatcher, Watcher};

pub use crate::error::LostReason;
pub use crate::key::HandleOwner;

/// What a store does natively. Plain booleans, as OpenDAL does it.
///
/// The [`Lock`](crate::Lock) emulates what is missing: it polls when there is no native wait,
/// falls back to an exclusive lock when there are no shared locks, polls only as a safety net
/// when the store [notifies](Capabilities::notifies) of changes, and renews or polls to find a
/// lost lock when the store does not [observe loss](Capabilities::observes_loss).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// An acquisition excludes other holders. False only for stores that lock nothing
    /// ([`NullStore`]).
    pub excludes: bool,
    /// Shared (read) locks: [`Store::save_read`] works.
    pub shared: bool,
    /// A native blocking write wait: [`Store::wait_and_save`] works.
    pub blocking: bool,
    /// A native blocking read wait: [`Store::wait_and_save_read`] works.
    pub blocking_shared: bool,
    /// Locks expire after their ttl; [`Store::put_off_expiration`] extends them.
    pub expiring: bool,
    /// Each exclusive acquisition gets a fencing token greater than every earlier one for that
    /// resource.
    pub fencing: bool,
    /// [`Store::watch`] reports releases, so waiters wake on release instead of polling.
    pub notifies: bool,
    /// Keys used with this store can be serialized and used by another process. Such a lock is
    /// stored data: when its holder's handles are all dropped it stays held until its ttl.
    /// Without it, the lock is held by something of this process, which goes with the holder
    /// and lets the lock go (see [`Lock`](crate::Lock#dropping-a-held-lock)).
    pub serializable_keys: bool,
    /// [`Store::holders`] tells who holds a resource.
    pub introspection: bool,
    /// A holder that dies (its process, or the connection or session that holds the lock) frees
    /// the lock at once. Without it, a dead holder's lock is free when its ttl runs out.
    pub liveness: bool,
    /// [`Store::watch_loss`] reports a lost lock (deleted, taken over, its file replaced, its
    /// connection closed) as it happens. Without it, a loss is found by the next refresh or
    /// check; expiry is always found by renewal.
    pub observes_loss: bool,
    /// A held lock stands on a lease the store keeps with the holder's process (an etcd
    /// lease, a pub/sub holder answering pings, a database session it pings), which another
    /// process can end while the holder is alive but silent; [`Store::lease_remaining`] tells
    /// how much of it the server confirmed.
    pub leased: bool,
    /// Counting semaphores: the methods work on keys with [`Permits`](crate::Permits)
    /// ([`Key::for_semaphore`]), and [`Store::usage`] tells how many are held. Without it a
    /// [`Semaphore`](crate::Semaphore) on the store is refused as unsupported, saying
    /// [why](Store::why_not_counting).
    pub counting: bool,
    /// Holders' metadata ([`Key::set_meta`]) and acquisition time are kept beside their locks
    /// and shown by [`Store::holders`] and [`Store::list`] (peers' holders show what the store
    /// can tell: token, expiry).
    pub metadata: bool,
    /// [`Store::list`] enumerates what is held. Without it, it answers `Unsupported`, saying
    /// [why](Store::why_not_listing).
    pub lists: bool,
    /// Waiters are served in the order they began waiting, among this library's holders: a
    /// waiting writer stops readers that came after it, and a newcomer does not take a free
    /// lock past a live waiter. Without it, a release wakes waiters and whichever asks first
    /// gets in (a stream of readers can starve a writer). Peers that do not know the queue
    /// (Python, PHP, `flock(1)`) can still get in first; they never break exclusion.
    pub fair: bool,
}

/// Where locks live. Object-safe: locks hold an `Arc<dyn Store>`.
///
/// Every method is called with the holder's [`Key`]. Outcomes are values ([`Saved`],
/// [`Holding`]); errors are failures of the store (the [`Lock`](crate::Lock) turns a refused
/// attempt into `Ok(false)` where the caller asked not to wait).
///
/// # Cancel safety
///
/// One rule for every store: **native waits must be cancel-safe and leave no waiter state;
/// other calls are never dropped once started.** A [`Lock`](crate::Lock) runs every call but
/// the native waits on its holder's executor: one at a time per holder, in order, each to its
/// end even if the caller stops waiting, and what it stored is taken back by the same executor
/// when nobody received it. So `save`, `delete`, `put_off_expiration` and the rest may assume
/// that they run to completion and that no other call of the same holder overlaps them; a
/// store that stops waiting for a request at its own timeout should let the request land
/// before the holder's next call rather than drop it (the built-in stores do). A dropped
/// `wait_and_save` may have been granted with nobody to receive it: the lock then asks
/// [`exists`](Store::exists) and takes back a grant the holder does not believe in, so a
/// native wait only has to stop waiting and remove its waiter state (a queue entry, a blocked
/// session) when dropped. Stores used without a [`Lock`](crate::Lock) (directly, or as members
/// of a quorum) get no such guarantee from the caller.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + fmt::Display + 'static {
    /// What this store does natively.
    fn capabilities(&self) -> Capabilities;

    /// Takes the write lock for `key`, or re-takes it (the holder that already writes), or
    /// promotes the holder's read lock when it is the sole reader. `ttl` is the lifetime on
    /// expiring stores (one round trip), ignored by the others; `None` means the store's
    /// default.
    ///
    /// Someone else holding the resource is [`Saved::Conflict`], saying what the holder still
    /// holds (a reader that cannot promote keeps its read lock).
    ///
    /// # Errors
    ///
    /// An expiry if the key's lifetime ran out before the store confirmed (what was stored is
    /// taken back); a storage error when the store failed; an invalid argument, with nothing
    /// stored, for a resource the store cannot lock (a name it cannot hold).
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved>;

    /// Takes a read lock for `key`, joins the current readers, or demotes the holder's write
    /// lock. Refused ([`Saved::Conflict`]) when another holder writes.
    ///
    /// # Errors
    ///
    /// As [`save`](Store::save); `Unsupported` without shared locks.
    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        let _ = ttl;
        Err(self.unsupported(key, "shared locks"))
    }

    /// Waits natively until the write lock is taken for `key`. A [`Saved::Conflict`] only when
    /// the wait cannot go on (the holder lost the read lock it was promoting).
    ///
    /// # Errors
    ///
    /// `Unsupported` unless [`Capabilities::blocking`].
    ///
    /// # Cancel safety
    ///
    /// Dropped while waiting, it must hold nothing and leave no waiter state behind; dropped
    /// after taking the lock, `delete` for the same key must remove it.
    async fn wait_and_save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        let _ = ttl;
        Err(self.unsupported(key, "native blocking waits"))
    }

    /// Waits natively until a read lock is taken for `key`.
    ///
    /// # Errors
    ///
    /// `Unsupported` unless [`Capabilities::blocking_shared`].
    ///
    /// # Cancel safety
    ///
    /// Dropped while waiting, it must hold nothing and leave no waiter state behind; dropped
    /// after taking the lock, `delete` for the same key must remove it.
    async fn wait_and_save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        let _ = ttl;
        Err(self.unsupported(key, "native blocking read waits"))
    }

    /// Extends the lifetime of what `key` holds to `ttl` from now. On stores without expiry it
    /// only checks that the holder still holds. Answers the mode held, or why nothing is
    /// ([`Holding::NotHeld`]: never held, released, expired, taken over); an expired entry is
    /// never revived.
    ///
    /// # Errors
    ///
    /// An expiry if the new lifetime ran out before the store confirmed; a storage error when
    /// the store failed.
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<Holding>;

    /// Releases what `key` holds on its resource, in either mode, and tears down the holder's
    /// handle. Returns whether a live lock was removed: `false` when the holder held nothing
    /// (never held, released, or lost it). Never touches another holder's lock.
    ///
    /// # Errors
    ///
    /// A storage error when the store failed.
    async fn delete(&self, key: &Key) -> Result<bool>;

    /// Lets what `key` holds end `after` from now, on the store's own clock and without this
    /// process: a release that keeps others out a while longer (a minimum hold). The stored
    /// lifetime becomes `after` (never less: a store that counts whole seconds, or ends a
    /// lock early, rounds up) and the holder's handle is let go as by
    /// [`delete`](Store::delete), leaving the stored lock to run out. Answers what the holder
    /// held, as [`put_off_expiration`](Store::put_off_expiration) does.
    ///
    /// `Ok(None)` (the default where locks do not expire, or stand on a lease the holder's
    /// process keeps) when the store cannot: the [`Lock`](crate::Lock) then keeps holding until
    /// `after` has passed and releases as usual. The default for other expiring stores is
    /// `put_off_expiration(key, after)`.
    ///
    /// # Errors
    ///
    /// A storage error when the store failed (the lock is then released by the caller).
    async fn release_after(&self, key: &Key, after: Duration) -> Result<Option<Holding>> {
        let caps = self.capabilities();
        if !caps.expiring || caps.leased {
            return Ok(None);
        }
        self.put_off_expiration(key, after).await.map(Some)
    }

    /// Whether `key` holds its resource, in which mode, or why not; changes nothing.
    ///
    /// # Errors
    ///
    /// A storage error when the store failed.
    async fn exists(&self, key: &Key) -> Result<Holding>;

    /// Registers `key`'s holder as a waiter for the next change on its resource. `Ok(None)`
    /// when the store cannot observe changes (the Lock then polls).
    ///
    /// The [`Lock`](crate::Lock) calls it only after an attempt was refused, then attempts
    /// again before it waits: a change between the refusal and the registration is seen by
    /// that attempt, and a change after the registration by the watcher. `waiting_since` is
    /// when the holder's wait began (its first refused attempt): a store that queues waiters
    /// (Redis) serves them in that order, and learns from the holder's next save that it
    /// waits. A fair store (in memory) keeps the holder's place for as long as one of its
    /// watchers lives, fired or not: keep the last watcher until the next one is registered
    /// (the [`Lock`](crate::Lock) does); dropping every one leaves the queue.
    ///
    /// # Errors
    ///
    /// A storage error when registering failed.
    async fn watch(&self, key: &Key, waiting_since: SystemTime) -> Result<Option<Watcher>> {
        let _ = (key, waiting_since);
        Ok(None)
    }

    /// Registers interest in the loss of `key`'s lock: the returned [`LossWatcher`] completes
    /// when the store sees that the holder no longer holds (also after its own release).
    /// `Ok(None)` (the default) when the store cannot see a lock go; the
    /// [`Lock`](crate::Lock) then finds out by renewing or checking.
    ///
    /// # Errors
    ///
    /// A storage error when registering failed.
    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        let _ = key;
        Ok(None)
    }

    /// Who holds `resource` right now (any holder, in any process the store can see). Read-only.
    ///
    /// # Errors
    ///
    /// `Unsupported` unless [`Capabilities::introspection`].
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        Err(Error::unsupported("the store cannot tell who holds a lock")
            .with_resource(resource)
            .with_store(self))
    }

    /// How many of the semaphore's permits are held, its stored limit, and by whom, for a key
    /// with [`Permits`](crate::Permits) (the key names the semaphore, its kind of token and its
    /// limit; it need not hold). Read-only.
    ///
    /// # Errors
    ///
    /// `Unsupported` unless [`Capabilities::counting`].
    async fn usage(&self, key: &Key) -> Result<crate::store::Usage> {
        Err(self.unsupported(key, "counting semaphores"))
    }

    /// Every resource whose name starts with `prefix` that somebody holds (locks and counting
    /// semaphores, each with its holders as [`holders`](Store::holders) tells, waiters where the
    /// store keeps a queue), in any order. Read-only; peers' locks are listed where the layout
    /// lets the store recognise them.
    ///
    /// # Errors
    ///
    /// `Unsupported` unless [`Capabilities::lists`], saying [why](Store::why_not_listing).
    async fn list(&self, prefix: &str) -> Result<Vec<crate::store::Listing>> {
        let _ = prefix;
        Err(
            Error::unsupported(format!("cannot list locks: {}", self.why_not_listing()))
                .with_store(self),
        )
    }

    /// Why the store cannot [`list`](Store::list) its locks (one clause), where
    /// [`Capabilities::lists`] is false.
    fn why_not_listing(&self) -> String {
        "the store cannot enumerate its locks".to_owned()
    }

    /// A notification of the next change of who holds `resource` (an acquisition or a
    /// release), for observers that hold nothing and wait for nothing (an election's
    /// [`observe`](crate::Election::observe)): it registers no waiter and takes no place in a
    /// queue. `Ok(None)` (the default) when the store cannot tell, and the observer polls.
    ///
    /// # Errors
    ///
    /// A storage error when registering failed.
    async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
        let _ = resource;
        Ok(None)
    }

    /// Why the store has no counting semaphores (one clause, for the `Unsupported` error a
    /// [`Semaphore`](crate::Semaphore) on it gets), where [`Capabilities::counting`] is false.
    fn why_not_counting(&self) -> String {
        "the store has no counting semaphores".to_owned()
    }

    /// The fencing counter behind `resource`'s tokens: every later exclusive acquisition gets a
    /// larger token. `Ok(None)` for stores without fencing.
    ///
    /// # Errors
    ///
    /// A storage error when the store failed.
    async fn fencing_counter(&self, resource: &str) -> Result<Option<u64>> {
        let _ = resource;
        Ok(None)
    }

    /// Shuts the store down gracefully: finishes the work it still runs in the background and
    /// closes the connections it opened. A store used again after `close` reconnects. Stores
    /// with nothing to close do nothing (the default).
    ///
    /// Call it before a process exits, or before the runtime shuts down: tasks still running
    /// then are dropped, and what they were doing is left to expiry.
    ///
    /// # Errors
    ///
    /// What failed to close, all of it (a [`CombinedStore`] tries every member).
    async fn close(&self) -> Result<()> {
        Ok(())
    }

    /// A pre-flight check: asks the server whether it is set up to keep locks, for
    /// `xtr-lock config check --ping`, `-v`, or an application's start. Each [`StoreWarning`]
    /// says what is wrong, why it endangers locks and what to do (Redis evicting keys, a
    /// replica named, replicas a fail-over can promote without the lock; Memcached evicting
    /// items). An empty list when nothing was found, or the store has nothing to ask (the
    /// default). Read-only, a few round trips; no lock waits for it.
    ///
    /// A server that refuses a question (a managed Redis that renames `CONFIG`) is a warning
    /// that it could not be checked; a quorum's unreachable member is a warning naming it.
    ///
    /// # Errors
    ///
    /// A storage error when the server cannot be reached (for a quorum: no member can).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads, and leaves nothing behind when dropped.
    async fn check(&self) -> Result<Vec<StoreWarning>> {
        Ok(Vec::new())
    }

    /// Descriptors that hold `key`'s lock for as long as any process keeps one open, for a
    /// parent handing its lock to a child process (`xtr-lock run` on flock, as `flock(1)`
    /// does): duplicates, with close-on-exec set. `Ok(None)` (the default) when the lock cannot
    /// outlive this process that way (it is a token on a server, or it dies with a connection).
    ///
    /// # Errors
    ///
    /// A storage error when a descriptor could not be duplicated.
    #[cfg(unix)]
    fn inheritable_descriptors(&self, key: &Key) -> Result<Option<Vec<OwnedFd>>> {
        let _ = key;
        Ok(None)
    }

    /// Where this store's locks live, credential-free: two stores that answer the same string
    /// hold their locks in the same place (one Redis database and prefix, one directory and
    /// file-name prefix, one in-memory table). A quorum refuses two such members: one lock
    /// would count twice. `None` (the default) when the store cannot tell.
    fn locks_in(&self) -> Option<String> {
        None
    }

    /// Where `resource`'s lock lives, for people and for other tools that take the same lock:
    /// flock's lock file (an absolute path, for `flock(1)` on the same resource), Redis's key
    /// name. `None` (the default) when there is nothing to point at.
    fn location(&self, resource: &str) -> Option<String> {
        let _ = resource;
        None
    }

    /// How long `key`'s lock is certain to last if its holder stops doing anything now (its
    /// process stopped, its connection silently cut), where the store keeps the lock on a lease
    /// of its own that the holder renews in the background, and that another process can end
    /// while the holder is alive but silent: etcd's lease (the end of the last keep-alive the
    /// cluster confirmed), pub/sub's `unavailable_timeout` after the last self-check the server
    /// answered, a session lock's pings (the last round trip plus the time the server takes
    /// to end a silent client's session). Only what the server confirmed counts: a renewal in
    /// flight lengthens nothing until it is answered. `None` (the default) when the store keeps
    /// no such lease (the ttl of an expiring store is
    /// [`remaining_lifetime`](crate::Lockable::remaining_lifetime)'s), or the holder holds nothing;
    /// `Duration::MAX` while it holds on no lease that can end sooner than the lock's own
    /// lifetime (a session lock on a server that never ends a silent client's session; a quorum
    /// whose needed members are such, or expiring members bound by that lifetime).
    /// `xtr-lock run` stops its command before the shorter of the two ends.
    fn lease_remaining(&self, key: &Key) -> Option<Duration> {
        let _ = key;
        None
    }

    /// An `Unsupported` error about `what`, naming this store and the key's resource.
    #[doc(hidden)]
    fn unsupported(&self, key: &Key, what: &str) -> Error {
        Error::unsupported(format!("the store does not support {what}"))
            .with_resource(key.resource())
            .with_store(self)
    }
}

/// Refuses a read save of a semaphore's key: permits have no shared mode (the
/// [`Lock`](crate::Lock) never asks; a store used directly may be asked).
pub(crate) fn refuse_shared_permits(key: &Key) -> Result<()> {
    match key.permits() {
        Some(_) => Err(
            Error::invalid_argument("a semaphore's permits have no shared mode")
                .with_resource(key.resource()),
        ),
        None => Ok(()),
    }
}

/// After a store confirmed a save or put-off: if the key's lifetime ran out meanwhile, take back
/// what was stored (errors ignored) and report the expiry.
///
/// # Errors
///
/// [`ErrorKind::Expired`](crate::ErrorKind::Expired) when the key has expired, even if the
/// delete failed.
///
/// # Cancel safety
///
/// If dropped while deleting, the lock may stay stored until it expires, which the caller's own
/// cancellation clean-up takes care of.
pub async fn check_expiry(store: &(impl Store + ?Sized), key: &Key) -> Result<()> {
    if key.is_expired() {
        if let Err(err) = store.delete(key).await {
            tracing::debug!(target: crate::logging::TARGET, resource = key.resource(),
                error = %err, "failed to take back an expired lock");
        }
        return Err(Error::expired(key.resource()).with_store(store));
    }
    Ok(())
}

macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        #[async_trait]
        #[deny(clippy::missing_trait_methods)]
        impl<T: Store + ?Sized> Store for $ty {
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
                (**self).save(key, ttl).await
            }
            async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
                (**self).save_read(key, ttl).await
            }
            async fn wait_and_save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
                (**self).wait_and_save(key, ttl).await
            }
            async fn wait_and_save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
                (**self).wait_and_save_read(key, ttl).await
            }
            async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<Holding> {
                (**self).put_off_expiration(key, ttl).await
            }
            async fn delete(&self, key: &Key) -> Result<bool> {
                (**self).delete(key).await
            }
            async fn release_after(&self, key: &Key, after: Duration) -> Result<Option<Holding>> {
                (**self).release_after(key, after).await
            }
            async fn exists(&self, key: &Key) -> Result<Holding> {
                (**self).exists(key).await
            }
            async fn watch(&self, key: &Key, waiting_since: SystemTime) -> Result<Option<Watcher>> {
                (**self).watch(key, waiting_since).await
            }
            async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
                (**self).watch_loss(key).await
            }
            async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
                (**self).holders(resource).await
            }
            async fn fencing_counter(&self, resource: &str) -> Result<Option<u64>> {
                (**self).fencing_counter(resource).await
            }
            async fn usage(&self, key: &Key) -> Result<crate::store::Usage> {
                (**self).usage(key).await
            }
            fn why_not_counting(&self) -> String {
                (**self).why_not_counting()
            }
            async fn list(&self, prefix: &str) -> Result<Vec<crate::store::Listing>> {
                (**self).list(prefix).await
            }
            fn why_not_listing(&self) -> String {
                (**self).why_not_listing()
            }
            async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
                (**self).watch_changes(resource).await
            }
            async fn close(&self) -> Result<()> {
                (**self).close().await
            }
            async fn check(&self) -> Result<Vec<StoreWarning>> {
                (**self).check().await
            }
            #[cfg(unix)]
            fn inheritable_descriptors(&self, key: &Key) -> Result<Option<Vec<OwnedFd>>> {
                (**self).inheritable_descriptors(key)
            }
            fn locks_in(&self) -> Option<String> {
                (**self).locks_in()
            }
            fn location(&self, resource: &str) -> Option<String> {
                (**self).location(resource)
            }
            fn lease_remaining(&self, key: &Key) -> Option<Duration> {
                (**self).lease_remaining(key)
            }
            fn unsupported(&self, key: &Key, what: &str) -> Error {
                (**self).unsupported(key, what)
            }
        }
    )*};
}

forward_store!(Arc<T>, Box<T>);
