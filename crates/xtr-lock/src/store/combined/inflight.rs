//! Member requests still running when a quorum operation's outcome is decided: they finish in
//! the background, and the same member's next request on the same resource waits for them, so
//! requests reach each member in the order the holder made them.
//!
//! This is the one ordering below the lock's executor (`crate::serial`): that one orders a
//! holder's calls on the quorum; this one lets a quorum call answer without its slowest member
//! while that member still sees the holder's requests in order. Waiting for every member
//! before the holder's next call would put the slowest member's timeout on every call.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::FutureExt as _;
use futures_util::StreamExt as _;
use futures_util::future::Shared;
use futures_util::stream::FuturesUnordered;

use crate::clock::BoxFuture;
use crate::error::Result;
use crate::logging::TARGET;
use crate::mutex::lock;

/// One member's answer to one request: the member's index and its result.
pub(super) type Answer<T> = (usize, Result<T>);

/// The requests of one operation, one per member, still running.
pub(super) type Pending<T> = FuturesUnordered<BoxFuture<'static, Answer<T>>>;

type Done = Shared<BoxFuture<'static, ()>>;

/// Background work one member's requests on one resource must wait for.
struct Wait {
    /// Ordered with the requests' ids: a request waits for the work of lower ids only (never
    /// for its own batch, detached after it was made).
    id: u64,
    done: Done,
    /// A request's landing (registered by [`Inflight::after`], with that request's id) rather
    /// than a detached batch.
    landing: bool,
}

/// Per member, per resource: the background work still running.
type Waits = HashMap<String, Vec<Wait>>;

/// Per member, per resource: the background requests the next request must wait for.
pub(super) struct Inflight {
    members: Vec<Mutex<Waits>>,
    ids: AtomicU64,
}

impl Inflight {
    pub(super) fn new(members: usize) -> Self {
        Inflight {
            members: (0..members).map(|_| Mutex::default()).collect(),
            ids: AtomicU64::new(0),
        }
    }

    fn member(&self, i: usize) -> std::sync::MutexGuard<'_, Waits> {
        lock(&self.members[i])
    }

    /// An id for a request made now (or a batch detached now).
    pub(super) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    /// The unfinished work on member `i` and `resource` that `keep` selects.
    fn pending(&self, i: usize, resource: &str, keep: impl Fn(&Wait) -> bool) -> Vec<Done> {
        let map = self.member(i);
        map.get(resource).map_or_else(Vec::new, |waits| {
            waits
                .iter()
                .filter(|w| keep(w) && w.done.peek().is_none())
                .map(|w| w.done.clone())
                .collect()
        })
    }

    /// Whether member `i`'s request `id` on `resource` would wait for anything now.
    pub(super) fn busy(&self, i: usize, resource: &str, id: u64) -> bool {
        !self.pending(i, resource, |w| w.id < id).is_empty()
    }

    /// Waits until the work on member `i` and `resource` that came before request `id` has
    /// finished, including a landing registered by an earlier request while this one waited.
    pub(super) async fn before(&self, i: usize, resource: &str, id: u64) {
        loop {
            let waits = self.pending(i, resource, |w| w.id < id);
            if waits.is_empty() {
                return;
            }
            futures_util::future::join_all(waits).await;
        }
    }

    /// Waits until what member `i`'s requests on `resource` left to land has landed: what a
    /// delete of that member must wait for (a detached batch it may be part of is not).
    pub(super) async fn landed(&self, i: usize, resource: &str) {
        loop {
            let waits = self.pending(i, resource, |w| w.landing);
            if waits.is_empty() {
                return;
            }
            futures_util::future::join_all(waits).await;
        }
    }

    /// Registers `done` for `members` on `resource` and forgets it once it has finished.
    fn register(
        self: &std::sync::Arc<Self>,
        members: &[usize],
        resource: &str,
        wait: (u64, Done, bool),
    ) {
        let (id, done, landing) = wait;
        for &i in members {
            self.member(i)
                .entry(resource.to_owned())
                .or_default()
                .push(Wait {
                    id,
                    done: done.clone(),
                    landing,
                });
        }
        let this = self.clone();
        let members = members.to_vec();
        let resource = resource.to_owned();
        // Counted with the locks' other background calls: `crate::settle` waits for it.
        crate::serial::spawn_counted(Box::pin(async move {
            done.await;
            for i in members {
                let mut map = this.member(i);
                if let Some(waits) = map.get_mut(&resource) {
                    waits.retain(|w| !(w.id == id && w.landing == landing));
                    if waits.is_empty() {
                        map.remove(&resource);
                    }
                }
            }
        }));
    }

    /// Lets `rest` finish in the background (on the current tokio runtime), logging failures;
    /// until it has, the next request of each member still in `rest` on `resource` waits for
    /// it. Outside a runtime, `rest` is finished here instead.
    pub(super) async fn detach<T: Send + 'static>(
        self: &std::sync::Arc<Self>,
        resource: &str,
        what: &'static str,
        members: &[usize],
        mut rest: Pending<T>,
    ) {
        if rest.is_empty() {
            return;
        }
        // Answers that have already arrived are taken here (one pass of the runtime, no wait):
        // what is left needs a background task.
        let mut members = members.to_vec();
        tokio::task::yield_now().await;
        while let Some(Some((i, result))) = rest.next().now_or_never() {
            members.retain(|&m| m != i);
            log_failure(resource, what, i, result);
        }
        if rest.is_empty() {
            return;
        }
        let members = &members[..];
        if tokio::runtime::Handle::try_current().is_err() {
            while rest.next().await.is_some() {}
            return;
        }
        let id = self.next_id();
        let owned = resource.to_owned();
        let work: BoxFuture<'static, ()> = Box::pin(async move {
            while let Some((i, result)) = rest.next().await {
                log_failure(&owned, what, i, result);
            }
        });
        self.register(members, resource, (id, work.shared(), false));
    }

    /// Lets `rest` (what member `i`'s request `id` on `resource` left to finish after
    /// answering) finish in the background; until it has, that member's later requests on
    /// `resource` wait for it.
    pub(super) fn after(
        self: &std::sync::Arc<Self>,
        i: usize,
        resource: &str,
        id: u64,
        rest: BoxFuture<'static, ()>,
    ) {
        self.register(&[i], resource, (id, rest.shared(), true));
    }

    /// Waits until everything detached so far has finished.
    pub(super) async fn await_detached(&self) {
        let all: Vec<Done> = (0..self.members.len())
            .flat_map(|i| {
                self.member(i)
                    .values()
                    .flatten()
                    .map(|w| w.done.clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        for done in all {
            done.await;
        }
    }
}

/// Logs a member's failure to finish what the quorum had decided without it.
fn log_failure<T>(resource: &str, what: &str, member: usize, result: Result<T>) {
    match result {
        // A release that fails leaves a lock behind until it expires: say so.
        Err(err) if what == "delete" => tracing::warn!(target: TARGET, resource, member,
            error = %err, "one store failed to delete the lock, after the quorum answered"),
        Err(err) => tracing::debug!(target: TARGET, resource, member, what, error = %err,
            "one store failed, after the quorum answered"),
        Ok(_) => {}
    }
}
