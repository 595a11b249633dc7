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
//! - Report "held by someone else" (and "no longer held by this holder") as
//!   [`Error::conflict`]. Where you know when the current holders' lifetimes end, attach it
//!   with [`Error::with_retry_after`] so waiters retry at that moment.
//! - With lifetimes: shorten the key's lifetime ([`Key::reduce_lifetime`]) **before** the round
//!   trip, and call [`check_expiry`] once the store has confirmed.
//! - `Display` is a short id without credentials; errors name the store by it.
//! - Run the conformance suite (feature `conformance`) on your store.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::clock::BoxFuture;
use crate::error::{Error, Result};
use crate::key::{Key, Mode};

mod channels;
mod combined;
#[cfg(all(feature = "flock", target_os = "linux"))]
mod flock;
mod memory;
mod null;

/// Re-exported so store implementors need no direct dependency on `async-trait`.
pub use async_trait::async_trait;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub use combined::{CombinedStore, ConsensusStrategy, Strategy, UnanimousStrategy};
#[cfg(all(feature = "flock", target_os = "linux"))]
pub use flock::FlockStore;
pub use memory::InMemoryStore;
pub use null::NullStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;

/// What a store does natively. Plain booleans, as OpenDAL does it.
///
/// The [`Lock`](crate::Lock) emulates what is missing: it polls when there is no native wait,
/// falls back to an exclusive lock when there are no shared locks, and polls only as a safety
/// net when the store [notifies](Capabilities::notifies) of changes.
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
    /// Keys used with this store can be serialized and used by another process.
    pub serializable_keys: bool,
    /// [`Store::holders`] tells who holds a resource.
    pub introspection: bool,
}

/// Someone holding a resource, as far as the store can tell (see [`Store::holders`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The mode it holds the resource in.
    pub mode: Mode,
    /// The process holding it, when the store knows (flock: from `/proc/locks`).
    pub pid: Option<u32>,
    /// The lifetime left, on stores with expiry.
    pub remaining: Option<Duration>,
    /// Which holder it is, where the store knows its token: 12 hex digits of the token's
    /// SHA-256, the same in every store of one kind (a Redis quorum's members agree on it) and
    /// safe to show, since it does not give the token away. [`Key::holder_id`] gives a key's.
    pub id: Option<String>,
}

impl HolderInfo {
    /// A holder in `mode`.
    pub fn new(mode: Mode, pid: Option<u32>, remaining: Option<Duration>) -> Self {
        HolderInfo {
            mode,
            pid,
            remaining,
            id: None,
        }
    }

    /// The holder whose token is `token` (sets [`id`](HolderInfo::id) to its digest).
    pub fn with_token(mut self, token: &str) -> Self {
        self.id = Some(crate::key::token_id(token));
        self
    }
}

/// What a successful save reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Acquired {
    /// The fencing token of this exclusive acquisition, where the store gives one. A re-save by
    /// the holder that already writes keeps its token.
    pub fencing_token: Option<u64>,
}

impl Acquired {
    /// An acquisition without a fencing token.
    pub fn new() -> Self {
        Acquired::default()
    }

    /// An acquisition with a fencing token.
    pub fn fenced(token: u64) -> Self {
        Acquired {
            fencing_token: Some(token),
        }
    }
}

/// A one-shot notification that something changed on a resource (a release, a demotion, an
/// expiry the store noticed).
///
/// It is registered when [`Store::watch`] returns, so a change that happens between that moment
/// and the moment it is awaited is not lost. It may also complete spuriously: waiters always try
/// again and watch again.
///
/// A watcher either sees **every** release ([`Watcher::new`]: the lock then does not poll), or
/// only some ([`Watcher::best_effort`]: for example Redis, where peers in other languages release
/// without publishing; the lock then keeps polling as a safety net).
#[must_use = "a watcher does nothing unless awaited"]
pub struct Watcher {
    fut: BoxFuture<'static, ()>,
    complete: bool,
}

impl Watcher {
    /// Wraps a future that completes on the next change; the store observes every release.
    pub fn new(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Watcher {
            fut: Box::pin(fut),
            complete: true,
        }
    }

    /// Wraps a future that completes on the next change the store happens to observe; some
    /// releases go unseen, so waiters also poll.
    pub fn best_effort(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Watcher {
            fut: Box::pin(fut),
            complete: false,
        }
    }

    /// Whether every release on the resource completes this watcher.
    pub fn sees_every_release(&self) -> bool {
        self.complete
    }
}

impl Future for Watcher {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.fut.as_mut().poll(cx)
    }
}

impl fmt::Debug for Watcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watcher")
            .field("sees_every_release", &self.complete)
            .finish_non_exhaustive()
    }
}

/// Where locks live. Object-safe: locks hold an `Arc<dyn Store>`.
///
/// Every method is called with the holder's [`Key`]; conflicts are
/// [`ErrorKind::Conflict`](crate::ErrorKind::Conflict) errors at this level (the
/// [`Lock`](crate::Lock) turns them into `Ok(false)` where the caller asked not to wait).
///
/// # Cancel safety
///
/// Implementations document their own. The [`Lock`](crate::Lock) assumes that a dropped `save`
/// may or may not have stored the lock, and takes it back with `delete`.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + fmt::Display + 'static {
    /// What this store does natively.
    fn capabilities(&self) -> Capabilities;

    /// Takes the write lock for `key`, or re-takes it (the holder that already writes), or
    /// promotes the holder's read lock when it is the sole reader. `ttl` is the lifetime on
    /// expiring stores (one round trip), ignored by the others; `None` means the store's
    /// default.
    ///
    /// # Errors
    ///
    /// A conflict when someone else holds the resource (a reader that cannot promote keeps its
    /// read lock); an expiry if the key's lifetime ran out before the store confirmed.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, the lock may or may not have been stored; a `delete` for the same key
    /// must then remove it. The [`Lock`](crate::Lock) relies on that to take it back.
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired>;

    /// Takes a read lock for `key`, joins the current readers, or demotes the holder's write
    /// lock.
    ///
    /// # Errors
    ///
    /// A conflict when another holder writes; `Unsupported` without shared locks.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, the lock may or may not have been stored; a `delete` for the same key
    /// must then remove it. The [`Lock`](crate::Lock) relies on that to take it back.
    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
        let _ = ttl;
        Err(self.unsupported(key, "shared locks"))
    }

    /// Waits natively until the write lock is taken for `key`.
    ///
    /// # Errors
    ///
    /// `Unsupported` unless [`Capabilities::blocking`].
    ///
    /// # Cancel safety
    ///
    /// Dropped while waiting, it must hold nothing and leave no waiter state behind; dropped
    /// after taking the lock, `delete` for the same key must remove it.
    async fn wait_and_save(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
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
    async fn wait_and_save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
        let _ = ttl;
        Err(self.unsupported(key, "native blocking read waits"))
    }

    /// Extends the lifetime of what `key` holds to `ttl` from now. On stores without expiry it
    /// only checks that the holder still holds.
    ///
    /// # Errors
    ///
    /// A conflict when the holder does not hold (never did, released, expired, taken over).
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, the lock keeps either its old or its new lifetime.
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<()>;

    /// Releases what `key` holds on its resource, in either mode. Returns whether something was
    /// removed: `false` when the holder held nothing (never held, released, or lost it).
    /// Never touches another holder's lock.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, the lock may or may not have been released; calling it again is
    /// harmless.
    async fn delete(&self, key: &Key) -> Result<bool>;

    /// Whether `key` holds its resource (either mode), without changing anything.
    ///
    /// # Cancel safety
    ///
    /// Must be cancel-safe: it changes nothing.
    async fn exists(&self, key: &Key) -> Result<bool>;

    /// Registers interest in the next change on `resource`. `Ok(None)` when the store cannot
    /// observe changes (the Lock then polls).
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, nothing is registered; a dropped [`Watcher`] unregisters itself.
    async fn watch(&self, resource: &str) -> Result<Option<Watcher>> {
        let _ = resource;
        Ok(None)
    }

    /// Who holds `resource` right now (any holder, in any process the store can see). Read-only.
    ///
    /// # Errors
    ///
    /// `Unsupported` unless [`Capabilities::introspection`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        Err(Error::unsupported("the store cannot tell who holds a lock")
            .with_resource(resource)
            .with_store(self))
    }

    /// The fencing counter behind `resource`'s tokens: every later exclusive acquisition gets a
    /// larger token. `Ok(None)` for stores without fencing.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
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
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, some connections may be closed and others not; calling it again
    /// finishes the job.
    async fn close(&self) -> Result<()> {
        Ok(())
    }

    /// An `Unsupported` error about `what`, naming this store and the key's resource.
    #[doc(hidden)]
    fn unsupported(&self, key: &Key, what: &str) -> Error {
        Error::unsupported(format!("the store does not support {what}"))
            .with_resource(key.resource())
            .with_store(self)
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
            tracing::debug!(target: "xtr_lock", resource = key.resource(), error = %err,
                "failed to take back an expired lock");
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
            async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
                (**self).save(key, ttl).await
            }
            async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
                (**self).save_read(key, ttl).await
            }
            async fn wait_and_save(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
                (**self).wait_and_save(key, ttl).await
            }
            async fn wait_and_save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
                (**self).wait_and_save_read(key, ttl).await
            }
            async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<()> {
                (**self).put_off_expiration(key, ttl).await
            }
            async fn delete(&self, key: &Key) -> Result<bool> {
                (**self).delete(key).await
            }
            async fn exists(&self, key: &Key) -> Result<bool> {
                (**self).exists(key).await
            }
            async fn watch(&self, resource: &str) -> Result<Option<Watcher>> {
                (**self).watch(resource).await
            }
            async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
                (**self).holders(resource).await
            }
            async fn fencing_counter(&self, resource: &str) -> Result<Option<u64>> {
                (**self).fencing_counter(resource).await
            }
            async fn close(&self) -> Result<()> {
                (**self).close().await
            }
            fn unsupported(&self, key: &Key, what: &str) -> Error {
                (**self).unsupported(key, what)
            }
        }
    )*};
}

forward_store!(Arc<T>, Box<T>);
