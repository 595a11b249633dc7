//! [`Lock`]: what users hold. Its API is [`Lockable`]; its store calls are in `calls.rs`,
//! acquiring in `acquire.rs`, renewal and loss watching in `monitor.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, ErrorKind, LostReason, Result, ShownResource};
use crate::holder::{Hold, Holder};
use crate::key::{Key, Mode};
use crate::logging::TARGET;
use crate::serial::Start;
use crate::store::{Holding, Store, check_expiry};
use lockable::{Lockable, Release, Wait};
use lost::KeepAlive;

mod acquire;
mod calls;
pub(crate) mod factory;
pub(crate) mod guard;
pub(crate) mod hold;
pub(crate) mod lockable;
pub(crate) mod lost;
mod monitor;
pub(crate) mod policy;
pub(crate) mod revoke;
pub(crate) mod scope;

/// Refuses a semaphore's key on a store that cannot count (saying why), and a lock's key
/// where a semaphore's is needed.
pub(crate) fn counting(store: &dyn Store, key: &Key) -> Result<()> {
    if key.permits().is_none() {
        return Err(Error::invalid_argument(
            "a semaphore needs a key with permits (Key::for_semaphore)",
        )
        .with_resource(key.resource()));
    }
    if !store.capabilities().counting {
        return Err(Error::unsupported(format!(
            "semaphores are not supported here: {}",
            store.why_not_counting()
        ))
        .with_resource(key.resource())
        .with_store(store));
    }
    Ok(())
}

/// An exclusive or shared lock on one resource, held by one [`Key`] in one [`Store`].
///
/// Made by a [`LockFactory`](crate::LockFactory); its methods are those of [`Lockable`] (waiting,
/// cancellation and lifetimes are described there), plus [`lock`](Lock::lock) and
/// [`scoped`](Lock::scoped), which keep the lock alive and report its loss. Clones, and locks
/// built from the same key, are one holder: acquiring what it already holds succeeds at once,
/// and one release lets go for all.
///
/// # Dropping a held lock
///
/// Dropping a `Lock` does **not** release it; what happens when the holder's last handle goes
/// (every clone, every lock of its key: an early `?` between `acquire` and `release`) depends on
/// where the lock lives, as [`Capabilities::serializable_keys`](crate::store::Capabilities::serializable_keys)
/// tells:
///
/// - **Stored data** (Redis, the SQL table, Memcached, in-memory; their keys can travel to
///   another process, which may hold the lock on): the lock **stays held until its ttl** runs
///   out (300 s by default). Going out of scope is not a release, since the key may live on
///   elsewhere (`xtr-lock acquire` hands its key to another process that way).
/// - **Something of this process** (flock's descriptor, a SysV semaphore, a PostgreSQL or
///   MySQL session, a pub/sub subscription, an etcd lease kept alive): it goes with the holder
///   and **the lock is let go** (at once, or in the background: the session closes, the lease
///   is revoked). Do not rely on it as a release: nothing reports what it found.
///
/// Where the lock must go on every path, hold it through a guard ([`lock`](Lock::lock):
/// dropped, it schedules the release) or a scope ([`scoped`](Lock::scoped),
/// [`LockFactory::run`](crate::LockFactory::run)), on every store alike.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// # fn step() -> xtr_lock::Result<()> { Ok(()) }
/// let lock = xtr_lock::LockFactory::from_dsn("in-memory")?.create_lock("report");
/// let guard = lock.lock().await?;
/// step()?; // an early return: the dropped guard releases, in the background
/// let _ = guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    key: Key,
    store: Arc<dyn Store>,
    ttl: Option<Duration>,
    keep_alive: bool,
    hold: hold::HoldLimits,
}

impl Lock {
    /// A lock for `key` in `store` with `ttl`: a `Duration`, or `None` (or zero) for no
    /// lifetime.
    pub fn new(key: Key, store: Arc<dyn Store>, ttl: impl Into<Option<Duration>>) -> Self {
        key.holder().in_store(store.as_ref());
        Lock {
            key,
            store,
            ttl: lifetime(ttl),
            keep_alive: true,
            hold: hold::HoldLimits::default(),
        }
    }

    /// The same holder with another ttl: a `Duration` (`with_ttl(Duration::from_secs(30))`),
    /// or `None` (or zero) for no lifetime. The one ttl setter's form across the crate: the
    /// factories' [`with_ttl`](crate::LockFactory::with_ttl), the blocking
    /// [`Lock::with_ttl`](crate::blocking::Lock::with_ttl) and
    /// [`RunOptions::ttl`](crate::RunOptions::ttl) take the same argument.
    ///
    /// The ttl is used where locks expire
    /// ([`Capabilities::expiring`](crate::store::Capabilities::expiring): Redis, the SQL table,
    /// Memcached; these refuse a lock without one), and on etcd as the ttl of the lease the
    /// store keeps alive for the holder (how long a dead holder's lock outlives it). Elsewhere
    /// (flock, SysV semaphores, advisory and `GET_LOCK` sessions, pub/sub, an in-memory store
    /// without a clock) it is not used: the lock lasts until its holder releases it or dies.
    #[must_use]
    pub fn with_ttl(mut self, ttl: impl Into<Option<Duration>>) -> Self {
        self.ttl = lifetime(ttl);
        self
    }

    /// Whether guards, scopes and [`keep_alive`](Lockable::keep_alive) renew an expiring lock
    /// (the default) or let it run out: then the lock is reported lost when its lifetime ends,
    /// and a scope's body is stopped.
    pub fn with_keep_alive(mut self, renew: bool) -> Self {
        self.keep_alive = renew;
        self
    }

    /// The same lock whose holder carries `meta` (who it is: a host, a job), kept beside the
    /// lock on stores with [`Capabilities::metadata`](crate::store::Capabilities::metadata)
    /// and shown by [`Store::holders`] and [`Store::list`]; see
    /// [`Key::set_meta`](crate::Key::set_meta).
    ///
    /// # Errors
    ///
    /// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) above
    /// [`MAX_META`](crate::MAX_META) bytes.
    pub fn with_meta(self, meta: impl Into<Vec<u8>>) -> crate::Result<Self> {
        self.key.set_meta(Some(meta.into()))?;
        Ok(self)
    }

    /// Whether an expiring lock is renewed while a guard or scope holds it.
    pub fn renews(&self) -> bool {
        self.keep_alive
    }

    /// The holder.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The resource.
    pub fn resource(&self) -> &str {
        self.key.resource()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The lifetime each acquisition gets, if any.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    fn holder(&self) -> &Holder {
        self.key.holder()
    }

    /// Whether a store answer of "not held" can mean a lost lock (not on a store that locks
    /// nothing).
    fn excludes(&self) -> bool {
        self.store.capabilities().excludes
    }

    async fn refresh_lock(&self, ttl: Option<Duration>) -> Result<()> {
        let Some(ttl) = ttl.or(self.ttl) else {
            return Err(Error::invalid_argument(
                "a refresh needs an expiration duration: pass one, or give the lock a ttl",
            )
            .with_resource(self.resource()));
        };
        if ttl.is_zero() || ttl > crate::limits::MAX_DURATION {
            return Err(Error::invalid_ttl(ttl).with_resource(self.resource()));
        }
        let (result, believed) = self
            .call(Start::IfAwaited, move |lock, _| async move {
                let believed = lock.holder().believed().hold != Hold::Free;
                let result = lock.put_off(ttl).await;
                (result, believed)
            })
            .await;
        self.refreshed(ttl, result, believed)
    }

    /// The store call of a refresh, inside its call: what it answered is recorded before the
    /// holder's next call (a release right after must not be overwritten by this answer).
    async fn put_off(&self, ttl: Duration) -> Result<Holding> {
        let holder = self.holder();
        let result = {
            // Until the store answers, what the holder believes is the lease from before.
            self.key.begin_renewal();
            let result = self.store.put_off_expiration(&self.key, ttl).await;
            let confirmed = matches!(result, Ok(Holding::Held(_)))
                || result.as_ref().is_err_and(Error::is_expired);
            self.key.end_renewal(confirmed);
            match &result {
                Ok(Holding::Held(mode)) => holder.found_held(*mode),
                Ok(Holding::NotHeld(reason)) if self.excludes() => {
                    holder.found_not_held(*reason);
                }
                Err(err) if err.is_expired() => {
                    holder.found_not_held(LostReason::Expired);
                }
                _ => {}
            }
            result
        };
        if matches!(result, Ok(Holding::Held(_)))
            && let Err(err) = check_expiry(self.store.as_ref(), &self.key).await
        {
            holder.found_not_held(LostReason::Expired);
            return Err(err);
        }
        result
    }

    fn refreshed(&self, ttl: Duration, result: Result<Holding>, believed: bool) -> Result<()> {
        match result {
            Ok(Holding::Held(_)) => {
                tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, ttl = ?ttl,
                    "expiration defined for the lock");
                Ok(())
            }
            Ok(Holding::NotHeld(reason)) => {
                if believed {
                    tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store, reason = %reason,
                        "failed to define an expiration for the lock: it was lost");
                    Err(Error::lost(self.resource(), reason).with_store(&self.store))
                } else {
                    tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store,
                        "failed to define an expiration for the lock: it is not held");
                    Err(Error::not_held(self.resource()).with_store(&self.store))
                }
            }
            Err(err) if err.is_expired() => Err(err),
            Err(err) => {
                crate::telemetry::refresh_failed(self.store.as_ref());
                tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store, error = %err,
                    "failed to define an expiration for the lock");
                Err(Error::wrap(
                    ErrorKind::Acquiring,
                    self.resource(),
                    "failed to define an expiration",
                    err,
                ))
            }
        }
    }

    async fn release_lock(&self) -> Result<Release> {
        // Once asked for, a release happens, even if its caller stops waiting: a minimum hold
        // that the store cannot leave to its own clock is waited out inside the call, too.
        let (deleted, believed) = self
            .call(Start::Always, |lock, _| async move {
                let believed = lock.holder().believed().hold;
                (lock.let_go().await, believed)
            })
            .await;
        self.release_outcome(believed, deleted)
    }

    /// What a release answers, from what the holder believed and what the store said.
    fn release_outcome(&self, believed: Hold, deleted: Result<bool>) -> Result<Release> {
        match deleted {
            Ok(removed) => {
                tracing::debug!(target: TARGET, resource = self.resource(), store = %self.store, "released the lock");
                Ok(match believed {
                    _ if !self.excludes() => Release::Released,
                    Hold::Lost(_) => Release::Lost,
                    _ if removed => Release::Released,
                    Hold::Held { .. } => Release::Lost,
                    Hold::Free => Release::NotHeld,
                })
            }
            Err(err) => {
                tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store, "failed to release the lock");
                if err.kind() == ErrorKind::Releasing {
                    Err(err)
                } else {
                    Err(Error::wrap(
                        ErrorKind::Releasing,
                        self.resource(),
                        "failed to release the lock",
                        err,
                    ))
                }
            }
        }
    }

    async fn ask_store(&self) -> Result<bool> {
        self.call(
            Start::IfAwaited,
            |lock, _| async move { lock.ask_now().await },
        )
        .await
    }

    /// The check, inside its call: recorded before the holder's next call.
    async fn ask_now(&self) -> Result<bool> {
        match self.store.exists(&self.key).await? {
            Holding::Held(mode) => {
                self.holder().found_held(mode);
                Ok(true)
            }
            Holding::NotHeld(reason) => {
                if self.excludes() && self.holder().found_not_held(reason) {
                    tracing::warn!(target: TARGET, resource = self.resource(), store = %self.store, reason = %reason,
                        "the lock was lost");
                }
                Ok(false)
            }
        }
    }
}

#[async_trait]
impl Lockable for Lock {
    fn resource(&self) -> &str {
        self.key.resource()
    }

    fn store_name(&self) -> Option<String> {
        Some(self.store.to_string())
    }

    async fn acquire_with(&self, mode: Mode, wait: Wait) -> Result<bool> {
        self.acquire_mode(mode, wait).await
    }

    async fn refresh(&self, ttl: Option<Duration>) -> Result<()> {
        self.refresh_lock(ttl).await
    }

    async fn release(&self) -> Result<Release> {
        self.release_lock().await
    }

    async fn is_acquired(&self) -> Result<bool> {
        self.ask_store().await
    }

    fn held_mode(&self) -> Option<Mode> {
        self.holder().mode()
    }

    fn lost_reason(&self) -> Option<LostReason> {
        match self.holder().believed().hold {
            Hold::Lost(reason) => Some(reason),
            Hold::Free | Hold::Held { .. } => None,
        }
    }

    fn is_expired(&self) -> bool {
        self.key
            .confirmed_lifetime()
            .is_some_and(|left| left.is_zero())
    }

    fn remaining_lifetime(&self) -> Option<Duration> {
        self.key.confirmed_lifetime()
    }

    fn fencing_token(&self) -> Option<u64> {
        self.holder().fencing_token()
    }

    fn keep_alive(&self) -> Result<KeepAlive> {
        monitor::start(self)
    }

    fn release_in_background(&self) {
        self.release_later();
    }
}

/// A ttl as every setter takes it: a `Duration` or an `Option`; `None` and zero are no lifetime.
pub(crate) fn lifetime(ttl: impl Into<Option<Duration>>) -> Option<Duration> {
    ttl.into().filter(|t| !t.is_zero())
}

impl fmt::Display for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Lock({}, {})",
            ShownResource(self.resource()),
            self.store
        )
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("store", &format_args!("{}", self.store))
            .field("ttl", &self.ttl)
            .field("keep_alive", &self.keep_alive)
            .field("hold", &self.hold)
            .finish()
    }
}
