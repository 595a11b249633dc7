//! [`CombinedStore`]: one lock over several stores, held when a quorum of them holds it
//! (Redlock over Redis servers, or any mix of stores).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt as _;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;

use super::{Acquired, Capabilities, HolderInfo, Store, Watcher};
use crate::clock::BoxFuture;
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::lock::TARGET;

mod inflight;
mod strategy;

use inflight::{Answer, Inflight, Pending};

pub use strategy::{ConsensusStrategy, Strategy, UnanimousStrategy};

/// Redlock's allowance for clock drift between the servers and this process: 1 % of the ttl
/// plus 2 ms (the Redlock paper's figures). A lease is trusted for ttl − elapsed − drift only.
fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// One lock over several stores: held when the [`Strategy`] says enough of them hold it.
///
/// - Members are asked **concurrently**: an acquire, refresh or release costs about one round
///   trip of the slowest member needed for the quorum, not the sum. Counting stops once the
///   outcome is decided; the members still answering then finish in the background, and each
///   member's next request on the resource waits for them, so every member sees the holder's
///   requests in order. [`close`](Store::close) waits for them.
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
/// - Requests left to finish in the background are dropped if the runtime shuts down first
///   (what they would have stored or removed is then left to expiry): call
///   [`close`](Store::close) before exiting.
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
    inflight: Arc<Inflight>,
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
            inflight: Arc::new(Inflight::new(stores.len())),
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

    /// Asks every member at once with `op`; each member's request waits for that member's
    /// background requests on the same resource first (see [`Inflight`]).
    async fn ask_all<T, F, Fut>(&self, key: &Key, op: F) -> Pending<T>
    where
        F: Fn(Arc<dyn Store>, Key) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        // Taken now, not when the requests are first polled: a request finished in the
        // background must never wait for its own batch.
        let waits = || {
            (0..self.stores.len())
                .map(|i| self.inflight.before(i, key.resource()))
                .collect::<Vec<_>>()
        };
        let mut befores = waits();
        if befores.iter().any(Option::is_some) {
            // Their answers may have arrived already: one turn of the runtime lets them be
            // taken, so this request goes out with the others rather than after a round trip.
            tokio::task::yield_now().await;
            befores = waits();
        }
        self.stores
            .iter()
            .zip(befores)
            .enumerate()
            .map(|(i, (store, before))| {
                let request = op(store.clone(), key.clone());
                Box::pin(async move {
                    if let Some(before) = before {
                        before.await;
                    }
                    (i, request.await)
                }) as BoxFuture<'static, Answer<T>>
            })
            .collect()
    }

    /// Leaves the members that have not answered to finish in the background.
    async fn detach<T: Send + 'static>(
        &self,
        key: &Key,
        what: &'static str,
        answered: &[bool],
        rest: Pending<T>,
    ) {
        let members: Vec<usize> = (0..answered.len()).filter(|&i| !answered[i]).collect();
        self.inflight
            .detach(key.resource(), what, &members, rest)
            .await;
    }

    /// Deletes from every member and waits for all of them; failures are logged and go no
    /// further.
    async fn delete_everywhere(&self, key: &Key) {
        let mut pending = self
            .ask_all(key, |s, k| async move { s.delete(&k).await })
            .await;
        while let Some((i, result)) = pending.next().await {
            if let Err(err) = result {
                tracing::warn!(target: TARGET, resource = key.resource(),
                    store = %self.stores[i], error = %err, "one store failed to delete the lock");
            }
        }
    }

    /// Takes back what a failed or expired acquisition stored: first let every member still
    /// answering finish (a late save must not land after the roll-back), then delete everywhere.
    async fn roll_back<T>(&self, key: &Key, mut pending: Pending<T>) {
        while pending.next().await.is_some() {}
        self.delete_everywhere(key).await;
    }

    async fn save_mode(&self, key: &Key, ttl: Option<Duration>, read: bool) -> Result<Acquired> {
        let n = self.stores.len();
        // A holder changing mode (promotion, demotion) or re-saving must keep what it held if
        // the quorum is missed: undo only the members that changed, never delete (DEF-2).
        let held_before = key.held();
        if let Some(ttl) = ttl.filter(|_| self.expiring()) {
            key.reduce_lifetime(ttl.saturating_sub(drift(ttl)));
        }
        let mut pending = self
            .ask_all(key, move |s, k| async move {
                save_member(&s, &k, ttl, read).await
            })
            .await;
        let mut answered = vec![false; n];
        let (mut yes, mut no) = (Vec::new(), 0);
        let mut retry_after: Option<Duration> = None;
        let mut decided = false;
        while let Some((i, result)) = pending.next().await {
            answered[i] = true;
            match result {
                Ok(_) => yes.push(i),
                Err(err) => {
                    no += 1;
                    if let Some(d) = err.retry_after() {
                        retry_after = Some(retry_after.map_or(d, |r| r.min(d)));
                    }
                    tracing::debug!(target: TARGET, resource = key.resource(),
                        store = %self.stores[i], error = %err, "one store failed to save the lock");
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
            // The members still answering finish in the background: the holder's lease then
            // stands on all of them, not only on the quorum that answered first.
            self.detach(key, "save", &answered, pending).await;
            return Ok(Acquired::new());
        }
        // Missed, or reached too late to be trusted (Redlock's validity): let every member
        // still answering finish first, so no late save lands after the roll-back.
        while let Some((i, result)) = pending.next().await {
            if result.is_ok() {
                yes.push(i);
            }
        }
        // Members report a lease that ran out as a failure: it is an expiry all the same.
        let expired = decided || key.is_expired();
        match held_before {
            None => {
                tracing::info!(target: TARGET, resource = key.resource(), success = yes.len(),
                    failure = no, "failed to store the lock, the quorum was not met");
                self.delete_everywhere(key).await;
            }
            Some(mode) => {
                // Put the members that changed back in the mode the holder had.
                for i in yes {
                    let _ = save_member(&self.stores[i], key, ttl, mode == Mode::Read).await;
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
            introspection: self
                .strategy
                .is_met(caps.iter().filter(|c| c.introspection).count(), caps.len()),
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
        let mut answered = vec![false; n];
        let mut pending = self
            .ask_all(key, move |s, k| async move {
                s.put_off_expiration(&k, ttl).await
            })
            .await;
        while !self.strategy.is_met(yes, n) {
            let Some((i, result)) = pending.next().await else {
                break;
            };
            answered[i] = true;
            match result {
                Ok(()) => yes += 1,
                Err(err) => {
                    no += 1;
                    tracing::debug!(target: TARGET, resource = key.resource(),
                        store = %self.stores[i], error = %err,
                        "one store failed to put off the expiration of the lock");
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
        self.detach(key, "put_off", &answered, pending).await;
        Ok(())
    }

    /// Deletes from every member at once, going on past failures (logged), and answers as soon
    /// as the outcome is decided: `true` when members enough to meet the strategy still held it
    /// (otherwise the lock had been lost). Members still answering finish in the background (a
    /// release does not wait for a slow or paused minority), ahead of the holder's next request
    /// to them; [`close`](CombinedStore::close) waits for them.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, some members may still hold; calling it again is harmless.
    async fn delete(&self, key: &Key) -> Result<bool> {
        let n = self.stores.len();
        let mut pending = self
            .ask_all(key, |s, k| async move { s.delete(&k).await })
            .await;
        let mut answered = vec![false; n];
        let (mut removed, mut not) = (0, 0);
        while let Some((i, result)) = pending.next().await {
            answered[i] = true;
            match result {
                Ok(true) => removed += 1,
                Ok(false) => not += 1,
                Err(err) => {
                    not += 1;
                    tracing::warn!(target: TARGET, resource = key.resource(),
                        store = %self.stores[i], error = %err, "one store failed to delete the lock");
                }
            }
            if self.strategy.is_met(removed, n) || !self.strategy.can_be_met(not, n) {
                break;
            }
        }
        self.detach(key, "delete", &answered, pending).await;
        Ok(self.strategy.is_met(removed, n))
    }

    /// Asks the members at once and answers as soon as the outcome is decided; a failing member
    /// counts as "no".
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it changes nothing.
    async fn exists(&self, key: &Key) -> Result<bool> {
        let n = self.stores.len();
        let mut pending = self
            .ask_all(key, |s, k| async move { s.exists(&k).await })
            .await;
        let (mut yes, mut no) = (0, 0);
        while let Some((i, result)) = pending.next().await {
            match result {
                Ok(true) => yes += 1,
                Ok(false) => no += 1,
                Err(err) => {
                    no += 1;
                    tracing::debug!(target: TARGET, resource = key.resource(),
                        store = %self.stores[i], error = %err, "one store failed to check the lock");
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

    /// The holders that members enough to meet the strategy report, told apart by
    /// [`HolderInfo::id`] (stores of one kind agree on it), else by pid; a holder is in write
    /// mode when members enough say so, and its remaining lifetime is the shortest any of them
    /// reports. A holder seen by too few members is left out, even where the members that did
    /// not answer might have made up the quorum. Holders are matched across members by id or
    /// pid, so a quorum without a majority of one kind (flock, Redis and in-memory members
    /// together: their tokens differ and only flock gives pids) cannot match its holders and
    /// lists none.
    ///
    /// # Errors
    ///
    /// A temporary storage error when too few members could answer to speak for the quorum.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: read-only.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let n = self.stores.len();
        let answers = join_all(self.stores.iter().map(|store| async move {
            if !store.capabilities().introspection {
                return None;
            }
            store
                .holders(resource)
                .await
                .inspect_err(|err| {
                    tracing::debug!(target: TARGET, resource, store = %store, error = %err,
                        "one store failed to tell who holds the lock");
                })
                .ok()
        }))
        .await;
        let answered = answers.iter().flatten().count();
        if !self.strategy.is_met(answered, n) {
            return Err(Error::storage(format!(
                "only {answered} of {n} stores could tell who holds the lock: too few to speak \
                 for the quorum"
            ))
            .with_resource(resource)
            .with_store(self)
            .temporary());
        }
        #[derive(Clone, PartialEq)]
        enum Who {
            Id(String),
            Pid(u32),
            Unknown(Mode),
        }
        let mut groups: Vec<(Who, Vec<HolderInfo>)> = Vec::new();
        for list in answers.into_iter().flatten() {
            let mut here: Vec<Who> = Vec::new();
            for holder in list {
                let who = match (&holder.id, holder.pid) {
                    (Some(id), _) => Who::Id(id.clone()),
                    (None, Some(pid)) => Who::Pid(pid),
                    (None, None) => Who::Unknown(holder.mode),
                };
                if here.contains(&who) {
                    continue; // one vote per member
                }
                match groups.iter_mut().find(|(w, _)| *w == who) {
                    Some((_, seen)) => seen.push(holder),
                    None => groups.push((who.clone(), vec![holder])),
                }
                here.push(who);
            }
        }
        Ok(groups
            .into_iter()
            .filter(|(_, seen)| self.strategy.is_met(seen.len(), n))
            .map(|(who, seen)| {
                let writes = seen.iter().filter(|h| h.mode == Mode::Write).count();
                let mode = if self.strategy.is_met(writes, n) {
                    Mode::Write
                } else {
                    Mode::Read
                };
                let pid = seen[0]
                    .pid
                    .filter(|p| seen.iter().all(|h| h.pid == Some(*p)));
                let mut holder =
                    HolderInfo::new(mode, pid, seen.iter().filter_map(|h| h.remaining).min());
                if let Who::Id(id) = who {
                    holder.id = Some(id);
                }
                holder
            })
            .collect())
    }

    /// Waits for the member requests still finishing in the background, then closes every
    /// member at once.
    ///
    /// # Errors
    ///
    /// One storage error listing every member that failed to close, after all were tried.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, some members may be closed and others not; calling it again
    /// finishes the job.
    async fn close(&self) -> Result<()> {
        self.inflight.settle().await;
        let results = join_all(self.stores.iter().map(|s| s.close())).await;
        let failures: Vec<String> = self
            .stores
            .iter()
            .zip(results)
            .filter_map(|(store, r)| r.err().map(|e| format!("{store}: {e}")))
            .collect();
        if failures.is_empty() {
            return Ok(());
        }
        Err(Error::storage(format!(
            "some of the combined stores failed to close: {}",
            failures.join("; ")
        ))
        .with_store(self))
    }
}
