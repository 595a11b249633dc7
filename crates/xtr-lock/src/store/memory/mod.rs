//! [`InMemoryStore`]: locks shared by the tasks and threads of one process.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;

use super::channels::Channels;
use super::{
    Acquired, Capabilities, Conflict, HolderInfo, Holding, Listing, LossWatcher, Saved, Store,
    Watcher, check_expiry,
};
use crate::clock::Clock;
use crate::error::{LostReason, Result};
use crate::key::{Key, Mode};
use crate::mutex::lock;

mod entry;
mod queue;
mod semaphore;

use entry::{Entry, Writer};

/// The token kind in-memory stores use: one token per key for all of them.
const KIND: &str = "memory";

/// When a waiter kept out of a free lock by the queue alone looks again: the head normally
/// takes the lock at once and its release wakes the next, but a head's lease can run out with
/// nobody seeing it (a ttl and no release), and only a later attempt prunes it.
pub(super) const QUEUE_RECHECK: Duration = Duration::from_millis(250);

/// Locks in this process's memory, shared by every task, thread and runtime that uses a clone of
/// the store.
///
/// - Shared and exclusive locks; the sole reader promotes, a writer demotes.
/// - Fair: waiters are served in the order their waits began, a waiting writer stops later
///   readers, and a newcomer does not take a free lock past a waiter; only the waiters whose
///   turn it is are woken (in-process notification, never by polling).
/// - A holder is told at once when its lock is deleted behind its back
///   ([`watch_loss`](Store::watch_loss)).
/// - Each exclusive acquisition gets a fencing token greater than every earlier one of this store;
///   a reader gets the latest exclusive token (every later writer's exceeds it).
/// - Clones share state; two stores made with [`new`](InMemoryStore::new) share nothing.
/// - A deserialized copy of a key is the same holder (holders are told apart by token).
///
/// # Guarantees
///
/// Excludes the holders that use this store instance (or its clones) inside one process. It is
/// safe across threads and tokio runtimes: the state sits behind a plain mutex that is never held
/// across an `.await`.
///
/// # Failure modes
///
/// None: operations cannot fail except for conflicts. Locks die with the process.
///
/// # Clock assumptions
///
/// [`new`](InMemoryStore::new) never expires anything and ignores ttls, like the Python peer.
/// [`expiring`](InMemoryStore::expiring) honours ttls on the given monotonic clock; use the same
/// clock for the keys (a [`LockFactory`](crate::LockFactory) with that clock does it).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use xtr_lock::{InMemoryStore, LockFactory, Lockable as _};
///
/// let factory = LockFactory::new(InMemoryStore::new());
/// let a = factory.create_lock("report");
/// let b = factory.create_lock("report");
/// assert!(a.try_acquire().await?);
/// assert!(!b.try_acquire().await?);
/// let _ = a.release().await?;
/// assert!(b.try_acquire().await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct InMemoryStore {
    inner: Arc<Shared>,
}

struct Shared {
    clock: Option<Arc<dyn Clock>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    resources: HashMap<String, Entry>,
    /// One change channel per watched resource.
    watchers: Channels,
    last_fence: u64,
    /// The last waiter's ticket number (ties between waits that began at once go by it).
    next_ticket: u64,
    /// Counting semaphores, by name (apart from the locks).
    semaphores: HashMap<String, semaphore::Sem>,
}

impl InMemoryStore {
    /// A store whose locks never expire (ttls are ignored).
    pub fn new() -> Self {
        Self::build(None)
    }

    /// A store whose locks expire after their ttl, measured on `clock`.
    pub fn expiring(clock: Arc<dyn Clock>) -> Self {
        Self::build(Some(clock))
    }

    fn build(clock: Option<Arc<dyn Clock>>) -> Self {
        InMemoryStore {
            inner: Arc::new(Shared {
                clock,
                state: Mutex::new(State::default()),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this mutex cannot leave the maps half-updated in a way that
        // matters more than the panic itself; keep serving.
        lock(&self.inner.state)
    }

    /// The current instant and the expiry of a lock taken now with `ttl`.
    fn times(&self, ttl: Option<Duration>) -> (Instant, Option<Instant>) {
        match &self.inner.clock {
            Some(clock) => {
                let now = clock.now();
                (now, ttl.map(|t| now + t))
            }
            None => (Instant::now(), None),
        }
    }

    /// Shortens the key's lifetime before the "round trip", as every expiring store must.
    fn reduce(&self, key: &Key, ttl: Option<Duration>) {
        if let (Some(_), Some(ttl)) = (&self.inner.clock, ttl) {
            key.reduce_lifetime(ttl);
        }
    }

    /// A refusal, saying when the holders' leases end; refused by the queue alone (nobody
    /// holds), [`QUEUE_RECHECK`]: the head may take the lock with a lease that runs out unseen.
    fn conflict(entry: &Entry, token: &str, now: Instant) -> Saved {
        let conflict = Conflict::new().with_kept(entry.mode_of(token, now));
        Saved::Conflict(match entry.retry_after(token, now) {
            Some(d) => conflict.with_retry_after(d),
            None if !entry.others_hold(token, now) => conflict.with_retry_after(QUEUE_RECHECK),
            None => conflict,
        })
    }

    /// Something on `resource`'s lock went (a release, an expiry, a demotion): its watchers
    /// hear it and the waiters whose turn it is are woken.
    fn freed(st: &mut State, resource: &str, now: Instant) {
        st.notify(resource);
        if let Some(entry) = st.resources.get(resource) {
            entry.serve(now);
        }
    }

    async fn finish(&self, key: &Key, saved: Saved) -> Result<Saved> {
        if saved.is_acquired() {
            check_expiry(self, key).await?;
        }
        Ok(saved)
    }

    /// What `token` holds on `resource` now, or why not.
    fn holding(&self, resource: &str, token: &str) -> Holding {
        let (now, _) = self.times(None);
        match self.state().resources.get(resource) {
            Some(entry) => entry.holding(token, now),
            None => Holding::NotHeld(LostReason::Removed),
        }
    }
}

/// The entry for `resource`, pruned; the flag tells whether pruning freed something.
fn entry_in<'a>(
    resources: &'a mut HashMap<String, Entry>,
    resource: &str,
    now: Instant,
) -> (&'a mut Entry, bool) {
    let entry = resources.entry(resource.to_owned()).or_default();
    let changed = entry.prune(now);
    (entry, changed)
}

impl State {
    fn tidy(&mut self, resource: &str) {
        if self.resources.get(resource).is_some_and(Entry::is_empty) {
            self.resources.remove(resource);
        }
    }

    fn notify(&mut self, resource: &str) {
        self.watchers.notify(resource);
    }

    /// Wakes every waiter of `key`'s lock or semaphore: how long what they wait behind lasts
    /// has changed.
    fn wake_waiters(&self, key: &Key) {
        match key.permits() {
            Some(_) => self.semaphores.get(key.resource()).map(|s| &s.queue),
            None => self.resources.get(key.resource()).map(|e| &e.queue),
        }
        .into_iter()
        .for_each(queue::Queue::wake_all);
    }
}

/// The channel of acquisitions on `resource` (releases notify the resource's own).
fn changes(resource: &str) -> String {
    format!("acquired\0{resource}")
}

impl Default for InMemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for InMemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("in-memory")
    }
}

impl fmt::Debug for InMemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state();
        f.debug_struct("InMemoryStore")
            .field("expiring", &self.inner.clock.is_some())
            .field("resources", &st.resources.len())
            .finish()
    }
}

#[async_trait]
impl Store for InMemoryStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: true,
            shared: true,
            blocking: false,
            blocking_shared: false,
            expiring: self.inner.clock.is_some(),
            fencing: true,
            notifies: true,
            serializable_keys: true,
            introspection: true,
            // The lock dies with the process, and so does every holder that could wait for it.
            liveness: true,
            observes_loss: true,
            leased: false,
            counting: true,
            metadata: true,
            lists: true,
            fair: true,
        }
    }

    /// This table (clones share it).
    fn locks_in(&self) -> Option<String> {
        Some(format!("in-memory@{:p}", Arc::as_ptr(&self.inner)))
    }

    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        if let Some(permits) = key.permits() {
            return self.save_permits(key, permits, ttl).await;
        }
        let token = key.token(KIND);
        self.reduce(key, ttl);
        let result = {
            let (now, expires) = self.times(ttl);
            let mut guard = self.state();
            let st = &mut *guard;
            let (entry, pruned) = entry_in(&mut st.resources, key.resource(), now);
            // A reader promoting holds already: it goes before the queue.
            let passes = entry.readers.contains_key(&token) || entry.admits(&token, Mode::Write);
            let outcome = match &mut entry.writer {
                Some(w) if w.token == token => {
                    w.expires = expires;
                    Saved::Acquired(Acquired::fenced(w.fence))
                }
                Some(_) => Self::conflict(entry, &token, now),
                None if entry.readers.keys().any(|t| *t != token) => {
                    // Another reader holds: a promotion fails and the caller keeps its read lock.
                    Self::conflict(entry, &token, now)
                }
                // A waiter stands before it: the lock is kept for the head of the queue.
                None if !passes => Self::conflict(entry, &token, now),
                None => {
                    entry.readers.remove(&token);
                    // A promotion is a new (exclusive) acquisition.
                    entry.records.remove(&token);
                    st.last_fence += 1;
                    let fence = st.last_fence;
                    entry.writer = Some(Writer {
                        token: token.clone(),
                        fence,
                        expires,
                    });
                    Saved::Acquired(Acquired::fenced(fence))
                }
            };
            match outcome {
                Saved::Acquired(a) => {
                    entry.record(&token, key, a.fencing_token);
                    entry.queue.admitted(&token);
                    st.notify(&changes(key.resource()));
                }
                Saved::Conflict(_) => entry.refused(&token, Mode::Write, now),
            }
            if pruned {
                Self::freed(st, key.resource(), now);
            }
            st.tidy(key.resource());
            outcome
        };
        self.finish(key, result).await
    }

    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        super::refuse_shared_permits(key)?;
        let token = key.token(KIND);
        self.reduce(key, ttl);
        let result = {
            let (now, expires) = self.times(ttl);
            let mut guard = self.state();
            let st = &mut *guard;
            let (entry, pruned) = entry_in(&mut st.resources, key.resource(), now);
            let mut demoted = false;
            let passes = entry.readers.contains_key(&token) || entry.admits(&token, Mode::Read);
            let outcome = match &entry.writer {
                Some(w) if w.token != token => Self::conflict(entry, &token, now),
                // A writer waits before it (the lock is kept for the queue's head; a stream of
                // readers never starves a writer): it queues behind.
                None if !passes => Self::conflict(entry, &token, now),
                writer => {
                    if writer.is_some() {
                        entry.writer = None;
                        demoted = true;
                    }
                    entry.readers.insert(token.clone(), expires);
                    // Readers share the latest writer's token: every later writer's exceeds it.
                    Saved::Acquired(Acquired::fenced(st.last_fence))
                }
            };
            match outcome {
                Saved::Acquired(a) => {
                    entry.record(&token, key, a.fencing_token);
                    entry.queue.admitted(&token);
                    // Readers queued behind this one may come in with it.
                    entry.serve(now);
                    st.notify(&changes(key.resource()));
                }
                Saved::Conflict(_) => entry.refused(&token, Mode::Read, now),
            }
            if pruned || demoted {
                // Readers waiting behind the writer may come in now.
                Self::freed(st, key.resource(), now);
            }
            st.tidy(key.resource());
            outcome
        };
        self.finish(key, result).await
    }

    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        let token = key.token(KIND);
        self.reduce(key, Some(ttl));
        let holding = if key.permits().is_some() {
            self.put_off_permits(key, ttl)
        } else {
            let (now, expires) = self.times(Some(ttl));
            let mut guard = self.state();
            let st = &mut *guard;
            let entry = st.resources.entry(key.resource().to_owned()).or_default();
            // What the holder holds is read before pruning, so that an entry that expired is
            // reported as such (and then removed: an expired entry is never revived).
            let holding = entry.holding(&token, now);
            let pruned = entry.prune(now);
            match holding {
                Holding::Held(Mode::Write) => {
                    if let Some(w) = entry.writer.as_mut() {
                        w.expires = expires;
                    }
                }
                Holding::Held(Mode::Read) => {
                    if let Some(e) = entry.readers.get_mut(&token) {
                        *e = expires;
                    }
                }
                Holding::NotHeld(_) => {}
            }
            if pruned {
                Self::freed(st, key.resource(), now);
            }
            st.tidy(key.resource());
            holding
        };
        if holding.is_held() {
            check_expiry(self, key).await?;
        }
        Ok(holding)
    }

    /// With a clock, the entry ends `after` from now on it, and the waiters read it again
    /// (their last refusal said when the longer lifetime ended); without one, nothing expires.
    async fn release_after(&self, key: &Key, after: Duration) -> Result<Option<Holding>> {
        if self.inner.clock.is_none() {
            return Ok(None);
        }
        let held = self.put_off_expiration(key, after).await?;
        let mut st = self.state();
        st.notify(&semaphore::channel(key));
        st.wake_waiters(key);
        Ok(Some(held))
    }

    async fn delete(&self, key: &Key) -> Result<bool> {
        if key.permits().is_some() {
            return Ok(self.delete_permits(key));
        }
        let token = key.token(KIND);
        let (now, _) = self.times(None);
        let mut st = self.state();
        let Some(entry) = st.resources.get_mut(key.resource()) else {
            return Ok(false);
        };
        let pruned = entry.prune(now);
        let mut removed = entry.readers.remove(&token).is_some();
        if entry.writer.as_ref().is_some_and(|w| w.token == token) {
            entry.writer = None;
            removed = true;
        }
        entry.records.remove(&token);
        if removed || pruned {
            Self::freed(&mut st, key.resource(), now);
        }
        st.tidy(key.resource());
        Ok(removed)
    }

    async fn exists(&self, key: &Key) -> Result<Holding> {
        if !key.has_token(KIND) {
            return Ok(Holding::NotHeld(LostReason::Removed));
        }
        if key.permits().is_some() {
            return Ok(self.permits_holding(key));
        }
        Ok(self.holding(key.resource(), &key.token(KIND)))
    }

    async fn usage(&self, key: &Key) -> Result<crate::store::Usage> {
        Ok(self.usage_of(key))
    }

    /// One counter for the whole store, so strictly increasing for every resource.
    async fn fencing_counter(&self, _resource: &str) -> Result<Option<u64>> {
        Ok(Some(self.state().last_fence))
    }

    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let (now, _) = self.times(None);
        let st = self.state();
        Ok(st
            .resources
            .get(resource)
            .map(|entry| entry.holders(now))
            .unwrap_or_default())
    }

    /// Every lock and semaphore with a live holder whose name starts with `prefix`.
    async fn list(&self, prefix: &str) -> Result<Vec<Listing>> {
        let (now, _) = self.times(None);
        let st = self.state();
        let mut out: Vec<Listing> = st
            .resources
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(name, entry)| Listing::lock(name.clone(), entry.holders(now)))
            .filter(Listing::is_held)
            .collect();
        out.extend(semaphore::listed(&st.semaphores, prefix, now));
        Ok(out)
    }

    /// Wakes on the next acquisition or release of `resource`'s lock.
    async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
        let (mut released, mut acquired) = {
            let mut st = self.state();
            (
                st.watchers.subscribe(resource),
                st.watchers.subscribe(&changes(resource)),
            )
        };
        Ok(Some(Watcher::new(async move {
            // An error means the store is gone: nothing will change any more, so wake up.
            tokio::select! {
                _ = released.changed() => {}
                _ = acquired.changed() => {}
            }
        })))
    }

    /// Queues the holder (or keeps its place): waiters are let in in the order their waits
    /// began, and woken only when their turn may have come. Dropping the watcher leaves the
    /// queue (a waiter keeps its place while it keeps one of its watchers).
    async fn watch(&self, key: &Key, waiting_since: SystemTime) -> Result<Option<Watcher>> {
        Ok(Some(self.queue_up(key, waiting_since)))
    }

    /// Completes when the holder's entry is gone: deleted (by a deserialized copy of the key,
    /// say), pruned after expiring, or taken over. Every such change notifies the resource's
    /// channel; expiry alone does not, and is found by renewal.
    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        let token = key.token(KIND);
        let resource = key.resource().to_owned();
        let mut rx = self.state().watchers.subscribe(&semaphore::channel(key));
        let store = self.clone();
        let key = key.clone();
        Ok(Some(LossWatcher::new(async move {
            loop {
                let holding = match key.permits() {
                    Some(_) => store.permits_holding(&key),
                    None => store.holding(&resource, &token),
                };
                if let Holding::NotHeld(reason) = holding {
                    return reason;
                }
                if rx.changed().await.is_err() {
                    return LostReason::Removed;
                }
            }
        })))
    }
}

#[cfg(test)]
mod tests;
