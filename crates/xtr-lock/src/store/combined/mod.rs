//! [`CombinedStore`]: one lock over several stores, held when a quorum of them holds it
//! (Redlock over Redis servers, or any mix of stores).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;

use super::{Acquired, Capabilities, Store, Watcher};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::lock::TARGET;

mod strategy;

pub use strategy::{ConsensusStrategy, Strategy, UnanimousStrategy};

/// Redlock's allowance for clock drift between the servers and this process: 1 % of the ttl
/// plus 2 ms (the Redlock paper's figures). A lease is trusted for ttl − elapsed − drift only.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// One lock over several stores: held when the [`Strategy`] says enough of them hold it.
///
/// - Members are asked **concurrently**: an acquire costs about one round trip of the slowest
///   member needed for the quorum, not the sum. Counting stops once the outcome is decided.
/// - Any failure of a member (conflict, network, timeout, expiry) is a vote against. A lock that
///   falls short is taken back out of **every** member, after every member has answered (so no
///   late save lands after the roll-back), before the conflict is reported.
/// - One deadline: the lease is trusted for ttl − elapsed − drift (Redlock's validity rule, drift
///   = 1 % of the ttl + 2 ms); if nothing is left when the quorum is reached, everything is taken
///   back and the acquire reports [`ErrorKind::Expired`](crate::ErrorKind::Expired).
/// - Members of one kind share the holder's token (Redlock over several Redis servers sees one
///   holder); members that keep per-instance state (two flock stores on two directories) are
///   independent locks.
/// - `save_read` falls back to `save` on members without shared locks.
///
/// # Guarantees
///
/// With [`ConsensusStrategy`] over independent servers, two holders cannot both reach a majority
/// at once, so at most one holds the lock while leases are valid, whatever a minority of servers
/// does (crash, pause, restart with its data lost only if it stays down for a ttl, as Redlock
/// requires).
///
/// # Failure modes
///
/// - No fencing tokens: each member counts its own acquisitions, and the largest counter of one
///   majority need not exceed that of the previous one (their intersection only guarantees one
///   common member), so no number derived from them is sound. The store says `fencing: false`.
/// - Clock drift beyond the allowance, or process pauses longer than the remaining lease, break
///   Redlock's guarantee like any lease; keep ttls well above both.
/// - A failed acquire returns once every member answered or timed out.
///
/// # Clock assumptions
///
/// Each member keeps its own clock (Redis: its server's). The deadline is measured on the key's
/// monotonic clock from before the members were asked.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use std::time::Duration;
/// use xtr_lock::store::{CombinedStore, ConsensusStrategy};
///
/// let store = CombinedStore::from_dsns(
///     &["redis://r1:6379", "redis://r2:6379", "redis://r3:6379"],
///     ConsensusStrategy,
/// )?;
/// let lock = xtr_lock::LockFactory::new(store).create_lock("billing").with_ttl(Some(Duration::from_secs(30)));
/// lock.acquire().await?;
/// lock.release().await?;
/// # Ok(()) }
/// ```
pub struct CombinedStore {
    stores: Vec<Arc<dyn Store>>,
    strategy: Arc<dyn Strategy>,
}

impl CombinedStore {
    /// A store over `stores` with `strategy`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) without any store.
    pub fn new(stores: Vec<Arc<dyn Store>>, strategy: impl Strategy) -> Result<Self> {
        if stores.is_empty() {
            return Err(Error::invalid_argument(
                "a combined store needs at least one store to combine",
            ));
        }
        Ok(CombinedStore {
            stores,
            strategy: Arc::new(strategy),
        })
    }

    /// A store over the stores `dsns` name (see [`StoreFactory`](crate::StoreFactory)).
    ///
    /// # Errors
    ///
    /// The first DSN that names no store, showing its scheme only; or no DSN at all.
    pub fn from_dsns(dsns: &[&str], strategy: impl Strategy) -> Result<Self> {
        let stores = dsns
            .iter()
            .map(|d| crate::StoreFactory::create_store(d))
            .collect::<Result<Vec<_>>>()?;
        Self::new(stores, strategy)
    }

    fn expiring(&self) -> bool {
        self.stores.iter().any(|s| s.capabilities().expiring)
    }

    /// The members.
    pub fn stores(&self) -> &[Arc<dyn Store>] {
        &self.stores
    }

    fn conflict(&self, key: &Key, retry_after: Option<Duration>) -> Error {
        let err = Error::conflict(key.resource()).with_store(self);
        match retry_after {
            Some(d) => err.with_retry_after(d),
            None => err,
        }
    }

    /// Deletes from every member concurrently; failures are logged and go no further.
    async fn delete_all(&self, key: &Key) -> usize {
        let mut pending: FuturesUnordered<_> = self
            .stores
            .iter()
            .map(|s| async move { (s, s.delete(key).await) })
            .collect();
        let mut removed = 0;
        while let Some((store, result)) = pending.next().await {
            match result {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(err) => tracing::warn!(target: TARGET, resource = key.resource(),
                    store = %store, error = %err, "one store failed to delete the lock"),
            }
        }
        removed
    }

    /// Takes back what a failed or expired acquisition stored: first let every member still
    /// answering finish (a late save must not land after the roll-back), then delete everywhere.
    async fn roll_back<F: Future>(&self, key: &Key, mut pending: FuturesUnordered<F>) {
        while pending.next().await.is_some() {}
        self.delete_all(key).await;
    }

    async fn save_mode(&self, key: &Key, ttl: Option<Duration>, read: bool) -> Result<Acquired> {
        let n = self.stores.len();
        // A holder changing mode (promotion, demotion) or re-saving must keep what it held if
        // the quorum is missed: undo only the members that changed, never delete (DEF-2).
        let held_before = key.held();
        if let Some(ttl) = ttl.filter(|_| self.expiring()) {
            key.reduce_lifetime(ttl.saturating_sub(drift(ttl)));
        }
        let mut pending: FuturesUnordered<_> = self
            .stores
            .iter()
            .map(|s| async move { (s, save_member(s, key, ttl, read).await) })
            .collect();
        let (mut yes, mut no) = (Vec::new(), 0);
        let mut retry_after: Option<Duration> = None;
        let mut decided = false;
        while let Some((store, result)) = pending.next().await {
            match result {
                Ok(_) => yes.push(store),
                Err(err) => {
                    no += 1;
                    if let Some(d) = err.retry_after() {
                        retry_after = Some(retry_after.map_or(d, |r| r.min(d)));
                    }
                    tracing::debug!(target: TARGET, resource = key.resource(), store = %store,
                        error = %err, "one store failed to save the lock");
                }
            }
            if self.strategy.is_met(yes.len(), n) {
                decided = true;
                break;
            }
            if !self.strategy.can_be_met(no, n) {
                break;
            }
        }
        if decided && !key.is_expired() {
            return Ok(Acquired::new());
        }
        // Missed, or reached too late to be trusted (Redlock's validity): let every member
        // still answering finish first, so no late save lands after the roll-back.
        while let Some((store, result)) = pending.next().await {
            if result.is_ok() {
                yes.push(store);
            }
        }
        // Members report a lease that ran out as a failure: it is an expiry all the same.
        let expired = decided || key.is_expired();
        match held_before {
            None => {
                tracing::info!(target: TARGET, resource = key.resource(), success = yes.len(),
                    failure = no, "failed to store the lock, the quorum was not met");
                self.delete_all(key).await;
            }
            Some(mode) => {
                // Put the members that changed back in the mode the holder had.
                for store in yes {
                    let _ = save_member(store, key, ttl, mode == Mode::Read).await;
                }
            }
        }
        if expired {
            return Err(Error::expired(key.resource()).with_store(self));
        }
        Err(self.conflict(key, retry_after))
    }
}

async fn save_member(
    store: &Arc<dyn Store>,
    key: &Key,
    ttl: Option<Duration>,
    read: bool,
) -> Result<Acquired> {
    if read && store.capabilities().shared {
        store.save_read(key, ttl).await
    } else {
        store.save(key, ttl).await
    }
}

impl fmt::Display for CombinedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "combined({}, {})", self.stores.len(), self.strategy)
    }
}

impl fmt::Debug for CombinedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let members: Vec<String> = self.stores.iter().map(|s| s.to_string()).collect();
        f.debug_struct("CombinedStore")
            .field("strategy", &format_args!("{}", self.strategy))
            .field("stores", &members)
            .finish()
    }
}

#[async_trait]
impl Store for CombinedStore {
    fn capabilities(&self) -> Capabilities {
        let caps: Vec<Capabilities> = self.stores.iter().map(|s| s.capabilities()).collect();
        Capabilities {
            excludes: caps.iter().all(|c| c.excludes),
            shared: true,
            blocking: false,
            blocking_shared: false,
            expiring: caps.iter().any(|c| c.expiring),
            fencing: false,
            notifies: caps.iter().any(|c| c.notifies),
            serializable_keys: caps.iter().all(|c| c.serializable_keys),
            introspection: false,
        }
    }

    /// Asks every member at once; held when the strategy is met within the lease.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, members may hold the lock; `delete` takes it back from all of them
    /// (the [`Lock`](crate::Lock) does this for you).
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
        self.save_mode(key, ttl, false).await
    }

    /// As [`save`](CombinedStore::save), with read locks where members share.
    ///
    /// # Cancel safety
    ///
    /// As [`save`](CombinedStore::save).
    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
        self.save_mode(key, ttl, true).await
    }

    /// Extends the lease on every member at once (a member without expiry checks that the holder
    /// still holds there, rather than being counted as agreeing unasked, as the peers do);
    /// short of the quorum, the lock is taken back everywhere.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, each member keeps its old or new lease.
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<()> {
        let n = self.stores.len();
        if self.expiring() {
            key.reduce_lifetime(ttl.saturating_sub(drift(ttl)));
        }
        let (mut yes, mut no) = (0, 0);
        let mut pending: FuturesUnordered<_> = self
            .stores
            .iter()
            .map(|s| async move { (s, s.put_off_expiration(key, ttl).await) })
            .collect();
        while !self.strategy.is_met(yes, n) {
            let Some((store, result)) = pending.next().await else {
                break;
            };
            match result {
                Ok(()) => yes += 1,
                Err(err) => {
                    no += 1;
                    tracing::debug!(target: TARGET, resource = key.resource(), store = %store,
                        error = %err, "one store failed to put off the expiration of the lock");
                }
            }
            if !self.strategy.can_be_met(no, n) {
                break;
            }
        }
        if !self.strategy.is_met(yes, n) {
            tracing::warn!(target: TARGET, resource = key.resource(), success = yes, failure = no,
                "failed to define the expiration of the lock, the quorum was not met");
            self.roll_back(key, pending).await;
            if key.is_expired() {
                return Err(Error::expired(key.resource()).with_store(self));
            }
            return Err(self.conflict(key, None));
        }
        if key.is_expired() {
            self.roll_back(key, pending).await;
            return Err(Error::expired(key.resource()).with_store(self));
        }
        Ok(())
    }

    /// Deletes from every member at once, going on past failures (logged). `true` when the
    /// strategy is met by the members that still held it: otherwise the lock had been lost.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, some members may still hold; calling it again is harmless.
    async fn delete(&self, key: &Key) -> Result<bool> {
        let removed = self.delete_all(key).await;
        Ok(self.strategy.is_met(removed, self.stores.len()))
    }

    /// Asks the members at once and answers as soon as the outcome is decided; a failing member
    /// counts as "no".
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    async fn exists(&self, key: &Key) -> Result<bool> {
        let n = self.stores.len();
        let mut pending: FuturesUnordered<_> = self
            .stores
            .iter()
            .map(|s| async move { (s, s.exists(key).await) })
            .collect();
        let (mut yes, mut no) = (0, 0);
        while let Some((store, result)) = pending.next().await {
            match result {
                Ok(true) => yes += 1,
                Ok(false) => no += 1,
                Err(err) => {
                    no += 1;
                    tracing::debug!(target: TARGET, resource = key.resource(), store = %store,
                        error = %err, "one store failed to check the lock");
                }
            }
            if self.strategy.is_met(yes, n) {
                return Ok(true);
            }
            if !self.strategy.can_be_met(no, n) {
                return Ok(false);
            }
        }
        Ok(false)
    }

    /// Wakes when members enough to meet the strategy report a release: a holder's release
    /// touches a quorum, while a competing waiter's roll-back (a minority, or it would have
    /// won) does not, so waiters never wake each other in a loop. Best effort: the lock keeps
    /// polling for releases members cannot report.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped watchers unregister.
    async fn watch(&self, resource: &str) -> Result<Option<Watcher>> {
        let n = self.stores.len();
        let mut watchers = FuturesUnordered::new();
        for store in &self.stores {
            if let Ok(Some(w)) = store.watch(resource).await {
                watchers.push(w);
            }
        }
        if !self.strategy.is_met(watchers.len(), n) {
            return Ok(None); // a quorum's releases could never be seen
        }
        let strategy = self.strategy.clone();
        Ok(Some(Watcher::best_effort(async move {
            let mut fired = 0;
            while watchers.next().await.is_some() {
                fired += 1;
                if strategy.is_met(fired, n) {
                    return;
                }
            }
            std::future::pending::<()>().await;
        })))
    }
}
