//! Waking waiters on release: one wake channel per store (`__xtr_lock__:wake:<id>`, subscribed
//! once on the store's subscriber connection), a wait queue per resource on the server, and one
//! wake per release across every process.
//!
//! A waiter registers here (`watch`), then attempts: the refused save queues its ticket in the
//! same script that refused it. A release pops the first ticket (or every reader's) and
//! publishes it on the ticket's store channel; the reader task below wakes exactly that waiter.
//! A wake for a waiter that is no longer here is passed on (the `WAKE` script), and a dropped
//! waiter's ticket is taken out of the queue. See `docs/waking.md`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use futures_util::FutureExt as _;
use futures_util::StreamExt as _;
use futures_util::future::Shared;
use tokio::sync::Notify;

use super::grant::{Grants, parse_who};
use super::layout::WAKE_CHANNEL;
use super::leaving::{leave_queue, pass_on, revoke};
use super::servers::Servers;
use super::{Inner, RedisStore, lock};
use crate::clock::BoxFuture;
use crate::key::{Key, Mode};
use crate::logging::TARGET;
use crate::store::Watcher;

/// The channel a store's waiters are woken on (one server).
fn channel(id: &str) -> String {
    format!("{WAKE_CHANNEL}{id}")
}

pub(super) struct Notifier {
    pub(super) servers: Arc<Servers>,
    pub(super) connect_timeout: Duration,
    /// This store's wake channel id: 16 random bytes in url-safe base64 (22 characters).
    pub(super) id: String,
    /// A cluster: one sharded channel per slot waited in (see `sharded.rs`).
    pub(super) sharded: bool,
    pub(super) inner: Arc<Mutex<State>>,
}

#[derive(Default)]
pub(super) struct State {
    /// Registered waiters by (lock key, token): what a save asks.
    by_holder: HashMap<(String, String), Arc<Waiter>>,
    /// The same waiters by number: what a wake names.
    by_seq: HashMap<u64, Arc<Waiter>>,
    next_seq: u64,
    pub(super) sink: Option<redis::aio::PubSubSink>,
    /// Whether the server acknowledged the wake channel on the current connection. Tickets go
    /// out only while it has: a wake published to nobody is dropped by the server.
    subscribed: bool,
    /// A cluster's subscriber state (see `sharded.rs`).
    pub(super) shards: super::shards::Shards,
    /// Clean-ups under way in the background that can take a grant back, per (lock key,
    /// token): how many, and what wakes the holder's operations that wait for them (see
    /// `leaving.rs`).
    pub(super) settling: HashMap<(String, String), (usize, Arc<Notify>)>,
    /// The lock keys observers are told about on this connection (see `observers.rs`).
    pub(super) observed: super::observers::Observed,
    /// The task reading the subscriber connection (aborted by `close`).
    pub(super) reader: Option<tokio::task::AbortHandle>,
    /// The subscription under way, in a task of its own: waiters share its outcome, and it
    /// goes on whether or not any of them is polled (a waiter's future can lie dormant while
    /// its lock attempts; it must never hold up the others).
    subscribing: Option<Shared<BoxFuture<'static, bool>>>,
    /// After a failed connect or subscribe: no new try before this instant, and the pause
    /// before the next one (doubling up to [`MAX_BACKOFF`]). Waiters poll meanwhile, so an
    /// unreachable or paused server costs one connect timeout per back-off, not one per wait.
    retry_at: Option<(tokio::time::Instant, Duration)>,
}

/// The first and the longest pause between two tries to (re)connect the subscriber.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// One holder waiting on one lock key, through this store.
struct Waiter {
    seq: u64,
    lock_key: String,
    token: String,
    /// Watchers registered on it now (changed under the state lock).
    watchers: AtomicUsize,
    /// Woken for this waiter alone: a wake that comes before the watcher is polled is kept for
    /// it, and goes with it.
    wake: Notify,
    /// Whether the last refusal queued the ticket and every holder announces its release.
    announced: AtomicBool,
    /// The ticket last sent with a save, while the server may still keep it queued.
    queued: Mutex<Option<String>>,
    /// When its wait began, as its last registration said: µs since the Unix epoch, the
    /// ticket's score in the queue.
    since_us: AtomicU64,
    /// Direct hand-off: the grant a release sent it (see `grant.rs`).
    grants: Grants,
    /// What ends each of its lock tickets, set by the first: `:<ttl ms>` if it accepts grants.
    /// One for both modes, so a save's ticket and its other-mode twin differ only in the mode.
    grant_suffix: std::sync::OnceLock<String>,
}

impl Notifier {
    pub(super) fn new(servers: Arc<Servers>, connect_timeout: Duration, sharded: bool) -> Self {
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).expect("the operating system's random source failed");
        Notifier {
            servers,
            connect_timeout,
            id: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id),
            sharded,
            inner: Arc::default(),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.inner)
    }

    /// Registers `key`'s holder as a waiter on `lock_key`, waiting since `waiting_since`; its
    /// next save queues it. `None` when the wake channel cannot be had (the waiter then polls).
    pub(super) async fn watch(
        &self,
        store: &RedisStore,
        lock_key: String,
        key: &Key,
        waiting_since: SystemTime,
    ) -> Option<Watcher> {
        let slot = super::layout::slot_of(lock_key.as_bytes());
        let subscribed = if self.sharded {
            self.ensure_shard(store, slot).await
        } else {
            self.ensure_subscribed(store).await
        };
        if !subscribed {
            return None;
        }
        let token = key.token(super::KIND);
        let waiter = {
            let mut st = self.state();
            let st = &mut *st;
            let waiter = st
                .by_holder
                .entry((lock_key, token))
                .or_insert_with_key(|(lock_key, token)| {
                    st.next_seq += 1;
                    Arc::new(Waiter {
                        seq: st.next_seq,
                        lock_key: lock_key.clone(),
                        token: token.clone(),
                        watchers: AtomicUsize::new(0),
                        wake: Notify::new(),
                        announced: AtomicBool::new(false),
                        queued: Mutex::new(None),
                        since_us: AtomicU64::new(0),
                        grants: Grants::default(),
                        grant_suffix: std::sync::OnceLock::new(),
                    })
                })
                .clone();
            waiter
                .since_us
                .store(micros(waiting_since), Ordering::Relaxed);
            st.by_seq.insert(waiter.seq, waiter.clone());
            waiter.watchers.fetch_add(1, Ordering::Relaxed);
            waiter
        };
        let guard = WatchGuard {
            state: self.inner.clone(),
            store: Arc::downgrade(&store.inner),
            waiter: waiter.clone(),
        };
        let woken = waiter.clone();
        // The registration (and the ticket's place in the queue) lasts as long as the
        // watcher, not its future: a watcher that fired stays registered until the lock drops
        // it (after registering the next one, or once it holds), so a woken waiter keeps its
        // ticket, and a waiter's leaving is never taken for its wake.
        Some(Watcher::with_coverage(
            async move { woken.wake.notified().await },
            move || guard.waiter.announced.load(Ordering::Relaxed),
        ))
    }

    /// The ticket a save of `key`'s holder on `lock_key` sends: `Some` while it waits here and
    /// the wake channel is subscribed. Its writer's ticket asks a release to grant it the lock
    /// for the ttl the waiter's first ticket that knew said (`grant_ttl`: `None` not known yet,
    /// `Some(None)` no grants).
    pub(super) fn ticket(
        &self,
        lock_key: &str,
        key: &Key,
        mode: Mode,
        grant_ttl: Option<Option<Duration>>,
    ) -> Option<Ticket> {
        let tag = match mode {
            Mode::Write => 'w',
            Mode::Read => 'r',
        };
        let suffix = |w: &Waiter| match grant_ttl {
            Some(ttl) => w
                .grant_suffix
                .get_or_init(|| ttl.map(super::grant::ticket_suffix).unwrap_or_default())
                .clone(),
            None => w.grant_suffix.get().cloned().unwrap_or_default(),
        };
        self.ticket_with(lock_key, key, tag, suffix)
    }

    /// A ticket that starts with `tag` (`w`, `r`; `s` for a semaphore's waiter) and ends with
    /// `suffix` (a semaphore waiter's `.<permits>`).
    pub(super) fn ticket_tagged(
        &self,
        lock_key: &str,
        key: &Key,
        tag: char,
        suffix: &str,
    ) -> Option<Ticket> {
        self.ticket_with(lock_key, key, tag, |_| suffix.to_owned())
    }

    /// A ticket that starts with `tag` and ends with what `suffix` says for its waiter.
    fn ticket_with(
        &self,
        lock_key: &str,
        key: &Key,
        tag: char,
        suffix: impl FnOnce(&Waiter) -> String,
    ) -> Option<Ticket> {
        let st = self.state();
        // The common case, nobody of this store waiting, costs a lock and no allocation.
        if st.by_holder.is_empty() || !st.live(self.sharded, lock_key) {
            return None;
        }
        let token = key.token(super::KIND);
        let waiter = st.by_holder.get(&(lock_key.to_owned(), token))?.clone();
        let suffix = suffix(&waiter);
        let text = format!("{tag}{}{}{}{suffix}", waiter.token, self.id, waiter.seq);
        *lock(&waiter.queued) = Some(text.clone());
        let since_us = waiter.since_us.load(Ordering::Relaxed);
        Some(Ticket {
            text,
            since_us,
            waiter,
        })
    }

    /// Records what a save that sent `ticket` was answered: refused (with whether every holder
    /// announces its release) or admitted (the script took the ticket out of the queue).
    ///
    /// A refused save whose waiter left meanwhile (its acquire dropped while the save was on its
    /// way: the call runs to its end) queued a ticket nobody waits on, possibly after the
    /// waiter's `LEAVE` ran: it leaves again now.
    pub(super) fn answered(
        &self,
        store: &RedisStore,
        ticket: &Ticket,
        admitted: bool,
        announced: bool,
    ) {
        if admitted {
            *lock(&ticket.waiter.queued) = None;
        } else if ticket.waiter.watchers.load(Ordering::Relaxed) == 0 {
            let taken = ticket.waiter.grants.last_admitted();
            leave_queue(store, &ticket.waiter.lock_key, ticket.text.clone(), taken);
        }
        let live = self.state().live(self.sharded, &ticket.waiter.lock_key);
        ticket
            .waiter
            .announced
            .store(!admitted && announced && live, Ordering::Relaxed);
    }

    /// A save of `key`'s holder on `lock_key` that carried no ticket was admitted with `fence`:
    /// a grant the holder's registered waiter was offered up to it is spent.
    pub(super) fn admitted_unticketed(&self, lock_key: &str, key: &Key, fence: u64) {
        let st = self.state();
        if st.by_holder.is_empty() {
            return;
        }
        let holder = (lock_key.to_owned(), key.token(super::KIND));
        if let Some(waiter) = st.by_holder.get(&holder) {
            waiter.grants.admitted(fence);
        }
    }

    /// Makes sure the wake channel is subscribed on a live connection.
    pub(super) async fn ensure_subscribed(&self, store: &RedisStore) -> bool {
        let subscribing = {
            let mut st = self.state();
            if st.subscribed {
                return true;
            }
            if st
                .retry_at
                .is_some_and(|(at, _)| tokio::time::Instant::now() < at)
            {
                return false;
            }
            match &st.subscribing {
                // (One that ended without clearing the slot died with its runtime.)
                Some(under_way) if under_way.peek().is_none() => under_way.clone(),
                _ => {
                    let store = store.clone();
                    let task = tokio::spawn(async move {
                        let notifier = &store.inner.notifier;
                        let outcome = notifier.subscribe(&store).await;
                        notifier.subscribed(outcome)
                    });
                    let under_way: BoxFuture<'static, bool> =
                        Box::pin(async move { task.await.unwrap_or(false) });
                    let under_way = under_way.shared();
                    st.subscribing = Some(under_way.clone());
                    under_way
                }
            }
        };
        subscribing.await
    }

    /// Records how a subscription went.
    fn subscribed(&self, outcome: redis::RedisResult<()>) -> bool {
        let mut st = self.state();
        st.subscribing = None;
        match outcome {
            Ok(()) => {
                st.retry_at = None;
                st.subscribed = st.sink.is_some();
                st.subscribed
            }
            Err(err) => {
                let pause = st
                    .retry_at
                    .map_or(FIRST_BACKOFF, |(_, p)| (p * 2).min(MAX_BACKOFF));
                st.retry_at = Some((tokio::time::Instant::now() + pause, pause));
                tracing::debug!(target: TARGET, error = %err, retry_in = ?pause,
                    "cannot subscribe to wake notifications; waiters poll instead");
                false
            }
        }
    }

    /// Subscribes the wake channel, connecting first if needed (one at a time: the task that
    /// `ensure_subscribed` shares).
    async fn subscribe(&self, store: &RedisStore) -> redis::RedisResult<()> {
        let existing = self.state().sink.clone();
        let mut sink = match existing {
            Some(sink) => sink,
            None => self.connect(store).await?,
        };
        let subscribed =
            match tokio::time::timeout(self.connect_timeout, sink.subscribe(channel(&self.id)))
                .await
            {
                Ok(result) => result,
                Err(_) => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "subscribe timed out",
                ))),
            };
        if subscribed.is_err() {
            // The connection is no good (its reader may have died with another runtime): the
            // next waiter opens a new one.
            self.state().sink = None;
        }
        subscribed
    }

    /// Opens the subscriber connection and starts its reader task (from `subscribe`).
    async fn connect(&self, store: &RedisStore) -> redis::RedisResult<redis::aio::PubSubSink> {
        let pubsub = match tokio::time::timeout(self.connect_timeout, async {
            let client = self.servers.subscriber_client().await?;
            let client = client.ok_or_else(|| {
                redis::RedisError::from((redis::ErrorKind::Client, "a cluster has no one server"))
            })?;
            client.get_async_pubsub().await
        })
        .await
        {
            Ok(result) => result?,
            Err(_) => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "connecting the subscriber timed out",
                )));
            }
        };
        let (sink, mut stream) = pubsub.split();
        let inner = self.inner.clone();
        let weak = Arc::downgrade(&store.inner);
        let reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let (channel, payload) = (msg.get_channel_name(), msg.get_payload_bytes());
                if payload.is_empty() && lock(&inner).observed.announce(channel.as_bytes(), payload)
                {
                    continue;
                }
                let Ok(payload) = msg.get_payload::<String>() else {
                    continue;
                };
                on_wake(&inner, &weak, &payload);
            }
            // The connection is gone: wake everyone so they retry (and re-watch, reconnecting).
            disconnected(&mut lock(&inner));
        });
        let mut st = self.state();
        st.subscribed = false;
        st.sink = Some(sink.clone());
        if let Some(old) = st.reader.replace(reader.abort_handle()) {
            old.abort();
        }
        Ok(sink)
    }

    /// Closes the subscriber connection: its reader stops (dropping the connection) and every
    /// waiter wakes to poll, subscribing on a new connection if it waits again.
    pub(super) fn close(&self) {
        let mut st = self.state();
        if let Some(reader) = st.reader.take() {
            reader.abort();
        }
        disconnected(&mut st);
        st.shards.close();
    }
}

impl State {
    /// Calls `f` with each registered waiter's lock key, its "every holder announces" flag and
    /// its wake.
    pub(super) fn for_each_waiter(&self, mut f: impl FnMut(&str, &AtomicBool, &Notify)) {
        for waiter in self.by_seq.values() {
            f(&waiter.lock_key, &waiter.announced, &waiter.wake);
        }
    }

    /// Whether wakes for waiters on `lock_key` reach this store now.
    fn live(&self, sharded: bool, lock_key: &str) -> bool {
        if sharded {
            self.shards
                .is_live(super::layout::slot_of(lock_key.as_bytes()))
        } else {
            self.subscribed
        }
    }
}

/// A ticket sent with a save, and the waiter it stands for.
pub(super) struct Ticket {
    pub(super) text: String,
    /// When the waiter's wait began (µs since the Unix epoch): its score in the queue.
    pub(super) since_us: u64,
    waiter: Arc<Waiter>,
}

impl Ticket {
    /// Its waiter's side of direct hand-off.
    pub(super) fn grants(&self) -> &Grants {
        &self.waiter.grants
    }
}

/// `t` in µs since the Unix epoch (1 before it, saturating), as the queue scores waits.
fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A wake: `<store id><waiter number> <lock key>` (a semaphore waiter's: `<store id><waiter
/// number>.<permits> <time key>`; a grant's says more, see [`parse_who`]). Wakes that waiter,
/// or passes a lock's wake on (takes a grant back) when its waiter is gone.
pub(super) fn on_wake(state: &Arc<Mutex<State>>, store: &Weak<Inner>, payload: &str) {
    let Some((who, lock_key)) = payload.split_once(' ') else {
        return;
    };
    let who = parse_who(who);
    let woken = {
        let st = lock(state);
        let waiter = who.number.and_then(|seq| st.by_seq.get(&seq).cloned());
        waiter.filter(|w| w.lock_key == lock_key).map(|waiter| {
            // Offered under the state lock: a waiter that leaves after this finds the grant.
            let fresh = who
                .grant
                .as_ref()
                .is_none_or(|g| g.token == waiter.token && waiter.grants.offer(g.clone()));
            (waiter, fresh)
        })
    };
    match (woken, who.grant) {
        // A woken waiter keeps its ticket queued (and its place) until it gets in or leaves.
        (Some((waiter, true)), _) => waiter.wake.notify_one(),
        // A grant its waiter's save took in already (the save crossed the wake).
        (Some((_, false)), _) => {}
        (None, Some(grant)) => with_store(store, |s| revoke(&s, lock_key, grant)),
        // A semaphore waiter that left took its ticket out and woke who fits then.
        (None, None) if who.semaphore => {}
        (None, None) => with_store(store, |s| pass_on(&s, lock_key, who.tail)),
    }
}

/// Runs `f` on the store, if it is still open.
fn with_store(store: &Weak<Inner>, f: impl FnOnce(RedisStore)) {
    if let Some(inner) = store.upgrade() {
        f(RedisStore { inner });
    }
}

/// Forgets the subscriber connection and wakes every waiter, so they retry and re-watch.
pub(super) fn disconnected(st: &mut State) {
    st.sink = None;
    st.subscribed = false;
    st.observed.clear();
    for waiter in st.by_seq.values() {
        waiter.announced.store(false, Ordering::Relaxed);
        waiter.grants.distrust();
        waiter.wake.notify_one();
    }
}

/// Drops a watcher's interest; the last one takes the waiter's ticket out of the queue.
struct WatchGuard {
    state: Arc<Mutex<State>>,
    store: Weak<Inner>,
    waiter: Arc<Waiter>,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut st = lock(&self.state);
        if self.waiter.watchers.fetch_sub(1, Ordering::Relaxed) != 1 {
            return;
        }
        st.by_seq.remove(&self.waiter.seq);
        let holder = (self.waiter.lock_key.clone(), self.waiter.token.clone());
        if st
            .by_holder
            .get(&holder)
            .is_some_and(|w| Arc::ptr_eq(w, &self.waiter))
        {
            st.by_holder.remove(&holder);
        }
        drop(st);
        // Nobody can offer it a grant now (it is no longer found by number).
        let granted = self.waiter.grants.take();
        let ticket = lock(&self.waiter.queued).take();
        let Some(inner) = self.store.upgrade() else {
            return; // its wake will be passed on, its grant run out
        };
        let store = RedisStore { inner };
        if let Some(grant) = granted {
            revoke(&store, &self.waiter.lock_key, grant);
        } else if let Some(ticket) = ticket {
            let taken = self.waiter.grants.last_admitted();
            leave_queue(&store, &self.waiter.lock_key, ticket, taken);
        }
    }
}
