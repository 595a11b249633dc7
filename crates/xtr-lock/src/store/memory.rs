//! [`InMemoryStore`]: locks shared by the tasks and threads of one process.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::channels::Channels;
use super::{Acquired, Capabilities, HolderInfo, Store, Watcher, check_expiry};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::key::{Key, Mode};

/// The token kind in-memory stores use: one token per key for all of them.
const KIND: &str = "memory";

/// Locks in this process's memory, shared by every task, thread and runtime that uses a clone of
/// the store.
///
/// - Shared and exclusive locks; the sole reader promotes, a writer demotes.
/// - Waiters are woken on release (in-process notification), never only by polling.
/// - Each exclusive acquisition gets a fencing token greater than every earlier one of this store.
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
/// use xtr_lock::{InMemoryStore, LockFactory};
///
/// let factory = LockFactory::new(InMemoryStore::new());
/// let a = factory.create_lock("report");
/// let b = factory.create_lock("report");
/// assert!(a.try_acquire().await?);
/// assert!(!b.try_acquire().await?);
/// a.release().await?;
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
}

#[derive(Default)]
struct Entry {
    writer: Option<Writer>,
    /// Reader token → expiry.
    readers: HashMap<String, Option<Instant>>,
}

struct Writer {
    token: String,
    fence: u64,
    expires: Option<Instant>,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty()
    }

    /// Drops expired holders; returns whether any went.
    fn prune(&mut self, now: Instant) -> bool {
        let mut changed = false;
        if self
            .writer
            .as_ref()
            .is_some_and(|w| w.expires.is_some_and(|e| e <= now))
        {
            self.writer = None;
            changed = true;
        }
        let before = self.readers.len();
        self.readers.retain(|_, e| e.is_none_or(|e| e > now));
        changed || self.readers.len() != before
    }

    /// When the earliest holder other than `token` expires, if every one of them expires.
    fn retry_after(&self, token: &str, now: Instant) -> Option<Duration> {
        let mut earliest: Option<Instant> = None;
        let others = self
            .writer
            .iter()
            .filter(|w| w.token != token)
            .map(|w| w.expires)
            .chain(
                self.readers
                    .iter()
                    .filter(|(t, _)| t.as_str() != token)
                    .map(|(_, e)| *e),
            );
        for e in others {
            let e = e?;
            earliest = Some(earliest.map_or(e, |x| x.min(e)));
        }
        earliest.map(|e| e.saturating_duration_since(now))
    }
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
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
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

    fn conflict(&self, key: &Key, entry: &Entry, token: &str, now: Instant) -> Error {
        let err = Error::conflict(key.resource()).with_store(self);
        match entry.retry_after(token, now) {
            Some(d) => err.with_retry_after(d),
            None => err,
        }
    }

    async fn finish(&self, key: &Key, result: Result<Acquired>) -> Result<Acquired> {
        let acquired = result?;
        check_expiry(self, key).await?;
        Ok(acquired)
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
        }
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: the state changes synchronously, before the first await.
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
        let token = key.token(KIND);
        self.reduce(key, ttl);
        let result = {
            let (now, expires) = self.times(ttl);
            let mut guard = self.state();
            let st = &mut *guard;
            let (entry, pruned) = entry_in(&mut st.resources, key.resource(), now);
            let outcome = match &mut entry.writer {
                Some(w) if w.token == token => {
                    w.expires = expires;
                    Ok(Acquired::fenced(w.fence))
                }
                Some(_) => Err(self.conflict(key, entry, &token, now)),
                None if entry.readers.keys().any(|t| *t != token) => {
                    // Another reader holds: a promotion fails and the caller keeps its read lock.
                    Err(self.conflict(key, entry, &token, now))
                }
                None => {
                    entry.readers.remove(&token);
                    st.last_fence += 1;
                    let fence = st.last_fence;
                    entry.writer = Some(Writer {
                        token,
                        fence,
                        expires,
                    });
                    Ok(Acquired::fenced(fence))
                }
            };
            if outcome.is_err() {
                st.tidy(key.resource());
            }
            if pruned {
                st.notify(key.resource());
            }
            outcome
        };
        self.finish(key, result).await
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: the state changes synchronously, before the first await.
    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Acquired> {
        let token = key.token(KIND);
        self.reduce(key, ttl);
        let result = {
            let (now, expires) = self.times(ttl);
            let mut guard = self.state();
            let st = &mut *guard;
            let (entry, pruned) = entry_in(&mut st.resources, key.resource(), now);
            let mut demoted = false;
            let outcome = match &entry.writer {
                Some(w) if w.token != token => Err(self.conflict(key, entry, &token, now)),
                writer => {
                    if writer.is_some() {
                        entry.writer = None;
                        demoted = true;
                    }
                    entry.readers.insert(token, expires);
                    Ok(Acquired::new())
                }
            };
            if outcome.is_err() {
                st.tidy(key.resource());
            }
            if pruned || demoted {
                // Readers waiting behind the writer may come in now.
                st.notify(key.resource());
            }
            outcome
        };
        self.finish(key, result).await
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: the state changes synchronously, before the first await.
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<()> {
        let token = key.token(KIND);
        self.reduce(key, Some(ttl));
        {
            let (now, expires) = self.times(Some(ttl));
            let mut guard = self.state();
            let st = &mut *guard;
            let (entry, pruned) = entry_in(&mut st.resources, key.resource(), now);
            // Expired holders were pruned above, so an expired entry cannot be revived.
            let held = match &mut entry.writer {
                Some(w) if w.token == token => {
                    w.expires = expires;
                    true
                }
                _ => match entry.readers.get_mut(&token) {
                    Some(e) => {
                        *e = expires;
                        true
                    }
                    None => false,
                },
            };
            st.tidy(key.resource());
            if pruned {
                st.notify(key.resource());
            }
            if !held {
                return Err(Error::conflict(key.resource()).with_store(self));
            }
        }
        check_expiry(self, key).await
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: completes synchronously.
    async fn delete(&self, key: &Key) -> Result<bool> {
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
        st.tidy(key.resource());
        if removed || pruned {
            st.notify(key.resource());
        }
        Ok(removed)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: read-only and synchronous.
    async fn exists(&self, key: &Key) -> Result<bool> {
        if !key.has_token(KIND) {
            return Ok(false);
        }
        let token = key.token(KIND);
        let (now, _) = self.times(None);
        let st = self.state();
        let Some(entry) = st.resources.get(key.resource()) else {
            return Ok(false);
        };
        let alive = |e: Option<Instant>| e.is_none_or(|e| e > now);
        let writes = entry
            .writer
            .as_ref()
            .is_some_and(|w| w.token == token && alive(w.expires));
        let reads = entry.readers.get(&token).is_some_and(|e| alive(*e));
        Ok(writes || reads)
    }

    /// One counter for the whole store, so strictly increasing for every resource.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: read-only and synchronous.
    async fn fencing_counter(&self, _resource: &str) -> Result<Option<u64>> {
        Ok(Some(self.state().last_fence))
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: read-only and synchronous.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let (now, _) = self.times(None);
        let pid = Some(std::process::id());
        let left = |e: Option<Instant>| e.map(|e| e.saturating_duration_since(now));
        let st = self.state();
        let Some(entry) = st.resources.get(resource) else {
            return Ok(Vec::new());
        };
        let alive = |e: Option<Instant>| e.is_none_or(|e| e > now);
        let mut out: Vec<HolderInfo> = entry
            .writer
            .iter()
            .filter(|w| alive(w.expires))
            .map(|w| HolderInfo::new(Mode::Write, pid, left(w.expires)).with_token(&w.token))
            .collect();
        out.extend(
            entry
                .readers
                .iter()
                .filter(|(_, e)| alive(**e))
                .map(|(t, e)| HolderInfo::new(Mode::Read, pid, left(*e)).with_token(t)),
        );
        Ok(out)
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: registration is synchronous.
    async fn watch(&self, resource: &str) -> Result<Option<Watcher>> {
        let mut rx = self.state().watchers.subscribe(resource);
        Ok(Some(Watcher::new(async move {
            // An error means the store is gone: nothing will change any more, so wake up.
            let _ = rx.changed().await;
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[tokio::test]
    async fn a_lifetime_never_expires_by_default() {
        let store = InMemoryStore::new();
        let key = Key::new("r");
        store
            .save(&key, Some(Duration::from_millis(1)))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(store.exists(&key).await.unwrap());
        assert_eq!(key.remaining_lifetime(), None);
    }

    #[tokio::test]
    async fn two_stores_are_independent() {
        let (a, b) = (InMemoryStore::new(), InMemoryStore::new());
        let k1 = Key::new("r");
        let k2 = Key::new("r");
        a.save(&k1, None).await.unwrap();
        b.save(&k2, None).await.unwrap();
        assert!(!b.exists(&k1).await.unwrap());
        // Clones share.
        assert!(a.clone().exists(&k1).await.unwrap());
    }

    #[tokio::test]
    async fn put_off_on_a_holder_that_does_not_hold_is_a_conflict() {
        let store = InMemoryStore::new();
        let err = store
            .put_off_expiration(&Key::new("r"), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(err.is_conflict());
        assert_eq!(err.store(), Some("in-memory"));
    }

    #[tokio::test]
    async fn empty_entries_and_idle_watchers_do_not_pile_up() {
        let store = InMemoryStore::new();
        for i in 0..1000 {
            let key = Key::new(format!("r{i}"));
            store.save(&key, None).await.unwrap();
            drop(store.watch(key.resource()).await.unwrap());
            store.delete(&key).await.unwrap();
        }
        let st = store.state();
        assert!(st.resources.is_empty());
        assert!(st.watchers.len() <= 64, "{}", st.watchers.len());
    }

    #[tokio::test]
    async fn conflicts_carry_the_earliest_expiry_of_the_other_holders() {
        let clock = ManualClock::new();
        let store = InMemoryStore::expiring(Arc::new(clock.clone()));
        let a = Key::with_clock("r", Arc::new(clock.clone()));
        let b = Key::with_clock("r", Arc::new(clock.clone()));
        store.save(&a, Some(Duration::from_secs(10))).await.unwrap();
        clock.advance(Duration::from_secs(4));
        let err = store
            .save(&b, Some(Duration::from_secs(10)))
            .await
            .unwrap_err();
        assert_eq!(err.retry_after(), Some(Duration::from_secs(6)));
        clock.advance(Duration::from_secs(6));
        store.save(&b, Some(Duration::from_secs(10))).await.unwrap();
    }

    #[tokio::test]
    async fn an_expired_reader_cannot_revive_itself() {
        // DEF-4: one reader with a short lifetime, another with a long one.
        let clock = ManualClock::new();
        let store = InMemoryStore::expiring(Arc::new(clock.clone()));
        let short = Key::with_clock("r", Arc::new(clock.clone()));
        let long = Key::with_clock("r", Arc::new(clock.clone()));
        store
            .save_read(&short, Some(Duration::from_millis(300)))
            .await
            .unwrap();
        store
            .save_read(&long, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        clock.advance(Duration::from_millis(500));
        short.reset_lifetime();
        let err = store
            .put_off_expiration(&short, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(err.is_conflict());
        assert!(!store.exists(&short).await.unwrap());
        assert!(store.exists(&long).await.unwrap());
    }
}
