//! [`CombinedStore`]: one lock over several stores, held when a quorum of them holds it
//! (Redlock over Redis servers, or any mix of stores).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[cfg(unix)]
use std::os::fd::OwnedFd;

use async_trait::async_trait;
use futures_util::StreamExt as _;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;

use super::watch::Coverage;
use super::{Capabilities, HolderInfo, Holding, LossWatcher, Saved, Store, Watcher};
use crate::clock::BoxFuture;
use crate::error::{Error, Result};
use crate::key::{HandleOwner, Key};
use crate::logging::TARGET;

mod check;
mod holders;
mod inflight;
mod lease;
mod ops;
mod release;
mod strategy;
mod tally;

use crate::mutex::lock;
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
///   falls short is taken back from the members that stored it (and from those still answering,
///   in the background, once they answer). A quorum missed because members *failed* is a
///   storage error saying how many and why; a conflict only when the refusals alone miss it.
/// - A member given twice (or two members that lock in the same place) is refused.
/// - One deadline: the lease is trusted for ttl − elapsed − drift (Redlock's validity rule, drift
///   = 1 % of the ttl + 2 ms); if nothing is left when the quorum is reached, everything is taken
///   back and the acquire reports [`ErrorKind::Expired`](crate::ErrorKind::Expired).
/// - Members of one kind share the holder's token (Redlock over several Redis servers sees one
///   holder); members that keep per-instance state (two flock stores on two directories) are
///   independent locks.
/// - `save_read` falls back to `save` on members without shared locks. A refused promotion puts
///   the members that promoted back to reading, and the holder keeps its read lock where a
///   quorum still has it.
/// - A lock is lost when the members that still hold it can no longer meet the strategy:
///   [`watch_loss`](Store::watch_loss) counts the members' own loss reports.
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
/// - A save missed because of failures returns once every member answered or timed out; one
///   refused by members enough to miss the quorum returns at once.
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
/// use xtr_lock::Lockable as _;
/// use xtr_lock::store::{CombinedStore, ConsensusStrategy};
///
/// let store = CombinedStore::from_dsns(
///     &["redis://r1:6379", "redis://r2:6379", "redis://r3:6379"],
///     ConsensusStrategy,
/// )?;
/// let lock = xtr_lock::LockFactory::new(store).create_lock("billing").with_ttl(Duration::from_secs(30));
/// lock.acquire().await?;
/// let _ = lock.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CombinedStore {
    stores: Vec<Arc<dyn Store>>,
    strategy: Arc<dyn Strategy>,
    inflight: Arc<Inflight>,
    /// Finds each holder's record of the members it holds on (see [`lease`]).
    owner: HandleOwner,
}

impl CombinedStore {
    /// A store over `stores` with `strategy`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) without any store, or
    /// when two members hold their locks in the same place (the same store given twice, two
    /// stores on the same Redis database and prefix, or on the same directory): one holder's
    /// entry would count twice, and such a quorum can never be met by anyone.
    pub fn new(stores: Vec<Arc<dyn Store>>, strategy: impl Strategy) -> Result<Self> {
        if stores.is_empty() {
            return Err(Error::invalid_argument(
                "a combined store needs at least one store to combine",
            ));
        }
        for (i, a) in stores.iter().enumerate() {
            for b in &stores[..i] {
                let same_place = match (a.locks_in(), b.locks_in()) {
                    (Some(x), Some(y)) => x == y,
                    _ => std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b)),
                };
                if same_place {
                    return Err(Error::invalid_argument(format!(
                        "the same store is a member of the quorum twice ({a}): give each member once"
                    )));
                }
            }
        }
        Ok(CombinedStore {
            inflight: Arc::new(Inflight::new(stores.len())),
            stores,
            strategy: Arc::new(strategy),
            owner: HandleOwner::new(),
        })
    }

    fn expiring(&self) -> bool {
        self.stores.iter().any(|s| s.capabilities().expiring)
    }

    /// The members.
    pub fn stores(&self) -> &[Arc<dyn Store>] {
        &self.stores
    }

    /// Asks every member at once with `op`; each member's request waits for that member's
    /// background requests on the same resource first (see [`Inflight`]).
    async fn ask_all<T, F, Fut>(&self, key: &Key, op: F) -> Pending<T>
    where
        F: Fn(Arc<dyn Store>, Key) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let all: Vec<usize> = (0..self.stores.len()).collect();
        self.ask(key, &all, op).await
    }

    /// Runs `work` to its end even if the caller is dropped (on a task of the current runtime;
    /// outside one, here): clean-ups that must not stop half-way. `None` if the runtime shut
    /// down first.
    async fn protected<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => match runtime.spawn(work).await {
                Ok(out) => Some(out),
                Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                Err(_) => None,
            },
            Err(_) => Some(work.await),
        }
    }

    /// As [`ask_all`](Self::ask_all), of the members in `members` only.
    async fn ask<T, F, Fut>(&self, key: &Key, members: &[usize], op: F) -> Pending<T>
    where
        F: Fn(Arc<dyn Store>, Key) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        // Ordered now, not when the requests are first polled: a request finished in the
        // background must never wait for its own batch.
        let id = self.inflight.next_id();
        if members
            .iter()
            .any(|&i| self.inflight.busy(i, key.resource(), id))
        {
            // Their answers may have arrived already: one pass of the runtime lets them be
            // taken, so this request goes out with the others rather than after a round trip.
            tokio::task::yield_now().await;
        }
        members
            .iter()
            .map(|&i| {
                let request = op(self.stores[i].clone(), key.clone());
                let (inflight, resource) = (self.inflight.clone(), key.resource().to_owned());
                Box::pin(async move {
                    inflight.before(i, &resource, id).await;
                    // A member request given up on at its own timeout (SQL, Memcached, Redis)
                    // still lands before that member's later requests on the resource.
                    let (answer, rest) = crate::serial::gather(request).await;
                    if let Some(rest) = rest {
                        inflight.after(i, &resource, id, rest);
                    }
                    (i, answer)
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
        self.forget(key);
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

/// How long a waiter that some members woke, but not members enough to meet the strategy,
/// waits for the others before it tries anyway.
const PARTIAL_WAKE_GRACE: Duration = Duration::from_millis(50);

#[async_trait]
impl Store for CombinedStore {
    /// Each member's, in order, separated by `; `.
    fn location(&self, resource: &str) -> Option<String> {
        let all: Vec<String> = self
            .stores
            .iter()
            .filter_map(|s| s.location(resource))
            .collect();
        (!all.is_empty()).then(|| all.join("; "))
    }

    /// How long members enough to meet the strategy certainly hold: the longest span that
    /// many members reach. A member counts only if its last answer to a save or renewal said it
    /// holds (see the module `lease`); then a member
    /// on a lease for what its server confirmed, any other for as long as the lock lasts anyway
    /// (its ttl is the key's [`remaining_lifetime`](crate::Lockable::remaining_lifetime)).
    /// `None` when no member keeps a lease, or the holder has not acquired (or has released);
    /// `Duration::MAX` when the members needed for the quorum hold without a lease that can
    /// end sooner than the lock's own lifetime.
    fn lease_remaining(&self, key: &Key) -> Option<Duration> {
        self.quorum_lease(key)
    }

    fn why_not_counting(&self) -> String {
        "a quorum cannot bound a count (with limit 2 on three members, holders on members 1 and 2, \
         2 and 3, 1 and 3 each have a majority while every member counts 2)"
            .to_owned()
    }

    fn capabilities(&self) -> Capabilities {
        let caps: Vec<Capabilities> = self.stores.iter().map(|s| s.capabilities()).collect();
        let met = |f: fn(&Capabilities) -> bool| {
            self.strategy
                .is_met(caps.iter().filter(|c| f(c)).count(), caps.len())
        };
        Capabilities {
            excludes: caps.iter().all(|c| c.excludes),
            shared: true,
            blocking: false,
            blocking_shared: false,
            expiring: caps.iter().any(|c| c.expiring),
            fencing: false,
            notifies: caps.iter().any(|c| c.notifies),
            serializable_keys: caps.iter().all(|c| c.serializable_keys),
            introspection: met(|c| c.introspection),
            liveness: met(|c| c.liveness),
            // Only when every member watches can every loss that breaks the quorum be seen.
            observes_loss: caps.iter().all(|c| c.observes_loss),
            leased: caps.iter().any(|c| c.leased),
            counting: false,
            // The key (and its metadata) goes to every member as it is.
            metadata: caps.iter().all(|c| c.metadata),
            lists: caps.iter().all(|c| c.lists),
            fair: false,
        }
    }

    /// Asks every member at once; held when the strategy is met within the lease.
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        self.save_mode(key, ttl, false).await
    }

    /// As [`save`](CombinedStore::save), with read locks where members share.
    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        self.save_mode(key, ttl, true).await
    }

    /// Extends the lease on every member at once (a member without expiry checks that the holder
    /// still holds there, rather than being counted as agreeing unasked, as the peers do);
    /// short of the quorum, the lock is taken back everywhere.
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        self.put_off(key, ttl).await
    }

    /// Deletes from every member at once, going on past failures (logged), and answers as soon
    /// as the outcome is decided: `true` when members enough to meet the strategy still held it
    /// (otherwise the lock had been lost). Members still answering finish in the background (a
    /// release does not wait for a slow or paused minority), ahead of the holder's next request
    /// to them; [`close`](CombinedStore::close) waits for them.
    async fn delete(&self, key: &Key) -> Result<bool> {
        self.delete_quorum(key).await
    }

    /// Asks every member at once to let the lock run out, and waits for their answers: done
    /// where members enough to meet the strategy did (the others are released as usual).
    async fn release_after(&self, key: &Key, after: Duration) -> Result<Option<Holding>> {
        self.release_later(key, after).await
    }

    /// Asks the members at once and answers as soon as the outcome is decided; a failing member
    /// counts as "no". The holder writes when members enough to meet the strategy say so.
    async fn exists(&self, key: &Key) -> Result<Holding> {
        self.exists_quorum(key).await
    }

    /// Wakes when members enough to meet the strategy report a release: a holder's release
    /// touches a quorum, while a competing waiter's roll-back (a minority, or it would have
    /// won) does not, so waiters never wake each other in a loop. It sees every release when
    /// members enough to meet the strategy do (each member says so after each attempt);
    /// otherwise the lock keeps polling for releases members cannot report.
    ///
    /// Returns once members enough to meet the strategy are watching (or can no longer be): a
    /// member slow to register (paused, reconnecting) goes on registering inside the watcher
    /// and never delays the attempt.
    async fn watch(&self, key: &Key, waiting_since: SystemTime) -> Result<Option<Watcher>> {
        let registering = self
            .stores
            .iter()
            .map(|s| {
                let (s, k) = (s.clone(), key.clone());
                Box::pin(async move { s.watch(&k, waiting_since).await.ok().flatten() })
                    as BoxFuture<'static, _>
            })
            .collect();
        Ok(self.quorum_watcher(registering).await)
    }

    /// As [`watch`](CombinedStore::watch) does for waiters: each member's observer, combined;
    /// wakes when members enough to meet the strategy saw a change (or a grace after the
    /// first), `None` when too few members can notify observers (they poll).
    async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
        let registering = self
            .stores
            .iter()
            .map(|s| {
                let (s, r) = (s.clone(), resource.to_owned());
                Box::pin(async move { s.watch_changes(&r).await.ok().flatten() })
                    as BoxFuture<'static, _>
            })
            .collect();
        Ok(self.quorum_watcher(registering).await)
    }

    /// Completes when the members that still hold can no longer meet the strategy, counting
    /// the members that report a loss; members that cannot report one are assumed to hold (the
    /// lock's renewal finds out about them). `None` when no member reports loss.
    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        let n = self.stores.len();
        let registered = join_all(self.stores.iter().map(|s| s.watch_loss(key))).await;
        let mut watchers: FuturesUnordered<LossWatcher> = registered
            .into_iter()
            .filter_map(|w| w.ok().flatten())
            .collect();
        if watchers.is_empty() {
            return Ok(None);
        }
        let strategy = self.strategy.clone();
        Ok(Some(LossWatcher::new(async move {
            let mut reasons = Vec::new();
            while let Some(reason) = watchers.next().await {
                reasons.push(reason);
                if !strategy.is_met(n - reasons.len(), n) {
                    return tally::most_telling(&reasons).unwrap_or(reason);
                }
            }
            std::future::pending().await
        })))
    }

    /// The holders that members enough to meet the strategy report (see the `holders` module).
    ///
    /// # Errors
    ///
    /// A temporary storage error when too few members could answer to speak for the quorum.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        self.quorum_holders(resource).await
    }

    /// Every member's listing, merged per resource: held when held on members enough to meet
    /// the strategy (see `holders.rs`).
    async fn list(&self, prefix: &str) -> Result<Vec<crate::store::Listing>> {
        if !self.capabilities().lists {
            return Err(Error::unsupported(format!(
                "cannot list locks: {}",
                self.why_not_listing()
            ))
            .with_store(self));
        }
        self.quorum_list(prefix).await
    }

    /// The first member that cannot list says why.
    fn why_not_listing(&self) -> String {
        self.stores
            .iter()
            .find(|s| !s.capabilities().lists)
            .map_or_else(
                || "the members cannot enumerate their locks".to_owned(),
                |s| format!("a member cannot: {}", s.why_not_listing()),
            )
    }

    /// Every member's warnings, each naming its member; an unreachable member is a warning.
    async fn check(&self) -> Result<Vec<crate::store::StoreWarning>> {
        self.check_members().await
    }

    /// Waits for the member requests still finishing in the background, then closes every
    /// member at once.
    ///
    /// # Errors
    ///
    /// One storage error listing every member that failed to close, after all were tried.
    async fn close(&self) -> Result<()> {
        self.inflight.await_detached().await;
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

    /// The members' descriptors, when members enough to meet the strategy hold the lock by a
    /// descriptor (flock members): a child that inherits them holds a quorum of the lock.
    ///
    /// # Errors
    ///
    /// A member's error duplicating its descriptor.
    #[cfg(unix)]
    fn inheritable_descriptors(&self, key: &Key) -> Result<Option<Vec<OwnedFd>>> {
        let mut all = Vec::new();
        let mut members = 0;
        for store in &self.stores {
            if let Some(fds) = store.inheritable_descriptors(key)? {
                members += 1;
                all.extend(fds);
            }
        }
        Ok(self
            .strategy
            .is_met(members, self.stores.len())
            .then_some(all))
    }
}

impl CombinedStore {
    /// The members' watchers (as they register) combined into one: registered once members
    /// enough to meet the strategy registered (`None` when too few can), completing when
    /// members enough fired, or a grace after the first did.
    async fn quorum_watcher(
        &self,
        mut registering: FuturesUnordered<BoxFuture<'static, Option<Watcher>>>,
    ) -> Option<Watcher> {
        let n = self.stores.len();
        let mut watchers: FuturesUnordered<Watcher> = FuturesUnordered::new();
        let coverages: Arc<std::sync::Mutex<Vec<Coverage>>> = Arc::default();
        let covered = |w: &Watcher| {
            lock(&coverages).push(w.coverage());
        };
        let mut refused = 0;
        while !self.strategy.is_met(watchers.len(), n) {
            match registering.next().await {
                Some(Some(w)) => {
                    covered(&w);
                    watchers.push(w);
                }
                Some(None) => refused += 1,
                None => break,
            }
            if !self.strategy.is_met(n - refused, n) {
                return None; // a quorum's releases could never be seen
            }
        }
        let strategy = self.strategy.clone();
        let late = coverages.clone();
        let fired = async move {
            let mut fired = 0;
            // Set at the first member's report: the others' come within a round trip of it
            // when a holder released, but may never come when members queued waiters in
            // different orders (a waiter admitted by one member and rolled back there left
            // that member's queue): a waiter woken by some members tries after a grace.
            let mut deadline: Option<tokio::time::Instant> = None;
            loop {
                let expired = async move {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    Some(registered) = registering.next() => {
                        if let Some(w) = registered {
                            lock(&late).push(w.coverage());
                            watchers.push(w);
                        }
                    }
                    Some(()) = watchers.next() => {
                        fired += 1;
                        if strategy.is_met(fired, n) {
                            return;
                        }
                        deadline.get_or_insert_with(|| {
                            tokio::time::Instant::now() + PARTIAL_WAKE_GRACE
                        });
                    }
                    () = expired => return,
                    else => std::future::pending::<()>().await,
                }
            }
        };
        let strategy = self.strategy.clone();
        Some(Watcher::with_coverage(fired, move || {
            let seen = lock(&coverages);
            strategy.is_met(seen.iter().filter(|c| c()).count(), n)
        }))
    }
}
