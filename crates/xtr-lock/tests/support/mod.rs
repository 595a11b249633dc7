//! Test support: factories on a manual clock, a store wrapper that records and perturbs what a
//! real store does, and a log capture.
//!
//! `Scripted` wraps a real store (the in-memory one): every operation reaches it. The wrapper
//! only records the calls, injects errors where a test asks for one, holds a reply "in flight"
//! after the real operation completed (what a network round trip looks like to a cancelled
//! caller), and can hide or add abilities. It never stands in for a server.

#![allow(dead_code)]

pub(crate) mod holder_process;
pub(crate) mod on_redis;
pub(crate) mod peer;
pub(crate) mod portalocker;
pub(crate) mod sections;
pub(crate) mod symfony_sql;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::Semaphore;
use xtr_lock::store::{Capabilities, Conflict, HolderInfo, Holding, LossWatcher, Saved, Watcher};
use xtr_lock::{Error, InMemoryStore, Key, LockFactory, LostReason, ManualClock, Result, Store};

/// `s` seconds.
pub(crate) fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A factory on `store` with an auto-advancing manual clock and no default ttl.
pub(crate) fn manual(store: Arc<dyn Store>) -> (LockFactory, ManualClock) {
    let clock = ManualClock::new();
    let factory = LockFactory::from_arc(store)
        .with_clock(Arc::new(clock.clone()))
        .with_ttl(None);
    (factory, clock)
}

/// An in-memory store whose locks expire by `clock`.
pub(crate) fn expiring_memory(clock: &ManualClock) -> InMemoryStore {
    InMemoryStore::expiring(Arc::new(clock.clone()))
}

// ---- a scripted store --------------------------------------------------------------------

/// Where an injected error strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    /// Instead of the operation: nothing reaches the store.
    Before,
    /// After the store applied the operation: the reply is lost.
    After,
}

#[derive(Default)]
struct Script {
    ops: Vec<String>,
    errors: HashMap<&'static str, VecDeque<(When, Error)>>,
    /// Answers given instead of the store's: a save refused, a put-off that finds nothing.
    refusals: HashMap<&'static str, VecDeque<LostReason>>,
    /// Operations whose reply is held after the store applied them, until `release_replies`.
    hold: Vec<&'static str>,
    /// Operations held before the store applies them, until `release_replies`.
    hold_before: Vec<&'static str>,
    /// Advance this clock by this much after the named operation applied.
    advance: Option<(&'static str, ManualClock, Duration)>,
    /// Hand out the inner store's watchers as best-effort ones.
    best_effort_watch: bool,
}

pub(crate) struct Scripted<S> {
    inner: S,
    script: Mutex<Script>,
    replies: Semaphore,
    caps: Box<dyn Fn(Capabilities) -> Capabilities + Send + Sync>,
}

impl<S: Store> Scripted<S> {
    pub(crate) fn new(inner: S) -> Arc<Self> {
        Self::with_caps(inner, |c| c)
    }

    /// Reports the capabilities `f` makes of the inner store's. With `blocking` or
    /// `blocking_shared` turned on, native waits are emulated over the inner store.
    pub(crate) fn with_caps(
        inner: S,
        f: impl Fn(Capabilities) -> Capabilities + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Scripted {
            inner,
            script: Mutex::new(Script::default()),
            replies: Semaphore::new(0),
            caps: Box::new(f),
        })
    }

    pub(crate) fn inner(&self) -> &S {
        &self.inner
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap()
    }

    /// The operations called so far, like `save(ttl=Some(10s))`, `delete`.
    pub(crate) fn ops(&self) -> Vec<String> {
        self.script().ops.clone()
    }

    pub(crate) fn op_names(&self) -> Vec<String> {
        self.ops()
            .into_iter()
            .map(|o| o.split('(').next().unwrap().to_owned())
            .collect()
    }

    pub(crate) fn clear_ops(&self) {
        self.script().ops.clear();
    }

    /// The next call of `op` fails with `err`, before or after reaching the store.
    pub(crate) fn fail_next(&self, op: &'static str, when: When, err: Error) {
        self.script()
            .errors
            .entry(op)
            .or_default()
            .push_back((when, err));
    }

    /// The next call of `op` (a save or a wait: refused; `put_off` or `exists`: not held, for
    /// `why`) is answered without reaching the store, as if someone else held the lock.
    pub(crate) fn refuse_next(&self, op: &'static str, why: LostReason) {
        self.script().refusals.entry(op).or_default().push_back(why);
    }

    fn refusal(&self, op: &'static str) -> Option<LostReason> {
        self.script()
            .refusals
            .get_mut(op)
            .and_then(VecDeque::pop_front)
    }

    /// Replies of `op` are held after the store applied it, until `release_replies`.
    pub(crate) fn hold_replies(&self, op: &'static str) {
        self.script().hold.push(op);
    }

    /// Requests of `op` wait before reaching the store, until `release_replies`.
    pub(crate) fn hold_requests(&self, op: &'static str) {
        self.script().hold_before.push(op);
    }

    pub(crate) fn release_replies(&self) {
        self.script().hold.clear();
        self.script().hold_before.clear();
        self.replies.add_permits(1_000);
    }

    /// Hands out the inner store's watchers as best-effort (some releases unseen).
    pub(crate) fn best_effort_watch(&self) {
        self.script().best_effort_watch = true;
    }

    /// After `op` applied, advance `clock` by `d` (a store slower than the lifetime).
    pub(crate) fn advance_after(&self, op: &'static str, clock: ManualClock, d: Duration) {
        self.script().advance = Some((op, clock, d));
    }

    async fn call<T>(
        &self,
        op: &'static str,
        detail: String,
        run: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let injected = {
            let mut s = self.script();
            s.ops.push(if detail.is_empty() {
                op.to_owned()
            } else {
                format!("{op}({detail})")
            });
            s.errors.get_mut(op).and_then(VecDeque::pop_front)
        };
        if let Some((When::Before, err)) = injected {
            return Err(err);
        }
        if self.script().hold_before.contains(&op) {
            self.replies.acquire().await.unwrap().forget();
        }
        let out = run.await;
        let (hold, advance) = {
            let s = self.script();
            let advance = s
                .advance
                .as_ref()
                .filter(|(o, _, _)| *o == op)
                .map(|(_, c, d)| (c.clone(), *d));
            (s.hold.contains(&op), advance)
        };
        if let Some((clock, d)) = advance {
            clock.advance(d);
        }
        if hold {
            self.replies.acquire().await.unwrap().forget();
        }
        match injected {
            Some((When::After, err)) => Err(err),
            _ => out,
        }
    }

    async fn emulated_wait(&self, key: &Key, ttl: Option<Duration>, read: bool) -> Result<Saved> {
        let since = SystemTime::now();
        // Each watcher is kept until the next one is registered: a store that queues waiters
        // keeps the holder's place while one of its watchers lives.
        let mut watcher;
        loop {
            watcher = self.inner.watch(key, since).await?;
            let saved = if read {
                self.inner.save_read(key, ttl).await
            } else {
                self.inner.save(key, ttl).await
            };
            match saved {
                Ok(Saved::Conflict(_)) => match watcher.as_mut() {
                    Some(w) => w.await,
                    None => tokio::time::sleep(Duration::from_millis(5)).await,
                },
                other => return other,
            }
        }
    }
}

impl<S: Store> fmt::Display for Scripted<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "scripted({})", self.inner)
    }
}

impl<S: Store> fmt::Debug for Scripted<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scripted({:?})", self.inner)
    }
}

fn ttl_detail(ttl: Option<Duration>) -> String {
    format!("ttl={ttl:?}")
}

#[async_trait]
impl<S: Store> Store for Scripted<S> {
    fn capabilities(&self) -> Capabilities {
        (self.caps)(self.inner.capabilities())
    }
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        if self.refusal("save").is_some() {
            self.script().ops.push(format!("save({})", ttl_detail(ttl)));
            return Ok(Saved::Conflict(Conflict::new()));
        }
        self.call("save", ttl_detail(ttl), self.inner.save(key, ttl))
            .await
    }
    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        if self.refusal("save_read").is_some() {
            self.script()
                .ops
                .push(format!("save_read({})", ttl_detail(ttl)));
            return Ok(Saved::Conflict(Conflict::new()));
        }
        self.call("save_read", ttl_detail(ttl), self.inner.save_read(key, ttl))
            .await
    }
    async fn wait_and_save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        if !self.capabilities().blocking {
            return Err(self.unsupported(key, "native blocking waits"));
        }
        if self.refusal("wait_and_save").is_some() {
            self.script()
                .ops
                .push(format!("wait_and_save({})", ttl_detail(ttl)));
            return Ok(Saved::Conflict(Conflict::new()));
        }
        self.call(
            "wait_and_save",
            ttl_detail(ttl),
            self.emulated_wait(key, ttl, false),
        )
        .await
    }
    async fn wait_and_save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        if !self.capabilities().blocking_shared {
            return Err(self.unsupported(key, "native blocking read waits"));
        }
        self.call(
            "wait_and_save_read",
            ttl_detail(ttl),
            self.emulated_wait(key, ttl, true),
        )
        .await
    }
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        if let Some(why) = self.refusal("put_off") {
            self.script().ops.push(format!("put_off(ttl={ttl:?})"));
            return Ok(Holding::NotHeld(why));
        }
        self.call(
            "put_off",
            format!("ttl={ttl:?}"),
            self.inner.put_off_expiration(key, ttl),
        )
        .await
    }
    async fn delete(&self, key: &Key) -> Result<bool> {
        self.call("delete", String::new(), self.inner.delete(key))
            .await
    }
    async fn exists(&self, key: &Key) -> Result<Holding> {
        self.call("exists", String::new(), self.inner.exists(key))
            .await
    }
    async fn close(&self) -> Result<()> {
        self.call("close", String::new(), self.inner.close()).await
    }
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        self.call("holders", String::new(), self.inner.holders(resource))
            .await
    }
    async fn fencing_counter(&self, resource: &str) -> Result<Option<u64>> {
        self.inner.fencing_counter(resource).await
    }
    async fn usage(&self, key: &Key) -> Result<xtr_lock::Usage> {
        self.call("usage", key.resource().to_owned(), self.inner.usage(key))
            .await
    }
    fn why_not_counting(&self) -> String {
        self.inner.why_not_counting()
    }
    async fn list(&self, prefix: &str) -> Result<Vec<xtr_lock::store::Listing>> {
        self.call("list", String::new(), self.inner.list(prefix))
            .await
    }
    fn why_not_listing(&self) -> String {
        self.inner.why_not_listing()
    }
    async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
        if !self.capabilities().notifies {
            return Ok(None);
        }
        self.inner.watch_changes(resource).await
    }
    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        if !self.capabilities().observes_loss {
            return Ok(None);
        }
        self.inner.watch_loss(key).await
    }
    fn inheritable_descriptors(&self, key: &Key) -> Result<Option<Vec<std::os::fd::OwnedFd>>> {
        self.inner.inheritable_descriptors(key)
    }
    async fn watch(&self, key: &Key, waiting_since: SystemTime) -> Result<Option<Watcher>> {
        if !self.capabilities().notifies {
            return Ok(None);
        }
        self.script().ops.push("watch".to_owned());
        let hold = self.script().hold_before.contains(&"watch");
        if hold {
            self.replies.acquire().await.unwrap().forget();
        }
        let watcher = self.inner.watch(key, waiting_since).await?;
        if self.script().best_effort_watch {
            return Ok(watcher.map(Watcher::best_effort));
        }
        Ok(watcher)
    }
}

// ---- log capture -------------------------------------------------------------------------

/// One captured tracing event.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub level: tracing::Level,
    pub target: String,
    pub message: String,
    pub fields: HashMap<String, String>,
}

#[derive(Clone, Default)]
pub(crate) struct Capture(Arc<Mutex<Vec<Record>>>);

impl Capture {
    pub(crate) fn records(&self) -> Vec<Record> {
        self.0.lock().unwrap().clone()
    }

    /// Installs the capture for this thread until the guard drops.
    pub(crate) fn install(&self) -> tracing::subscriber::DefaultGuard {
        use tracing_subscriber::layer::SubscriberExt as _;
        let subscriber = tracing_subscriber::registry().with(CaptureLayer(self.clone()));
        tracing::subscriber::set_default(subscriber)
    }
}

struct CaptureLayer(Capture);

struct Visitor<'a>(&'a mut Record);

impl tracing::field::Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        let v = format!("{value:?}");
        if field.name() == "message" {
            self.0.message = v;
        } else {
            self.0.fields.insert(field.name().to_owned(), v);
        }
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0.message = value.to_owned();
        } else {
            self.0
                .fields
                .insert(field.name().to_owned(), value.to_owned());
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CaptureLayer {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut record = Record {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            message: String::new(),
            fields: HashMap::new(),
        };
        event.record(&mut Visitor(&mut record));
        self.0.0.lock().unwrap().push(record);
    }
}

/// The innermost error of this crate in `err`'s chain: what a wrapping error (failed to
/// acquire, failed to release) was caused by.
pub(crate) fn root(err: &Error) -> &Error {
    let mut at = err;
    while let Some(next) = std::error::Error::source(at).and_then(|s| s.downcast_ref::<Error>()) {
        at = next;
    }
    at
}

/// Kills the connection named `name` on the Redis server at `url` (`CLIENT KILL ID`): how a
/// pub/sub holder is reaped. Panics unless exactly one connection has that name.
#[allow(dead_code)] // not every test binary reaps
pub(crate) async fn kill_client_named(url: &str, name: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    let ids: Vec<String> = list
        .lines()
        .filter(|line| line.split(' ').any(|f| f == format!("name={name}")))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), 1, "one connection named {name}: {list}");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&ids[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(killed, 1);
}
