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

/// One member's answer to one request: the member's index and its result.
pub(super) type Answer<T> = (usize, Result<T>);

/// The requests of one operation, one per member, still running.
pub(super) type Pending<T> = FuturesUnordered<BoxFuture<'static, Answer<T>>>;

type Done = Shared<BoxFuture<'static, ()>>;

/// Per resource: the work to wait for, its id, and whether it is a request's landing
/// (registered by [`Inflight::after`]) rather than a detached batch.
type Waits = HashMap<String, (u64, Done, bool)>;

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
        self.members[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What member `i`'s next request on `resource` must wait for, if anything.
    pub(super) fn before(&self, i: usize, resource: &str) -> Option<Done> {
        let map = self.member(i);
        map.get(resource)
            .filter(|(_, done, _)| done.peek().is_none())
            .map(|(_, done, _)| done.clone())
    }

    /// What member `i`'s request on `resource` left to land, if it is still landing: what a
    /// delete of that member must wait for (a detached batch it may be part of is not).
    pub(super) fn landing(&self, i: usize, resource: &str) -> Option<Done> {
        let map = self.member(i);
        map.get(resource)
            .filter(|(_, done, landing)| *landing && done.peek().is_none())
            .map(|(_, done, _)| done.clone())
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
        // Answers that have already arrived are taken here (one turn of the runtime, no wait):
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
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let owned = resource.to_owned();
        let work: BoxFuture<'static, ()> = Box::pin(async move {
            while let Some((i, result)) = rest.next().await {
                log_failure(&owned, what, i, result);
            }
        });
        let done = work.shared();
        for &i in members {
            self.member(i)
                .insert(resource.to_owned(), (id, done.clone(), false));
        }
        let this = self.clone();
        let members = members.to_vec();
        let resource = resource.to_owned();
        // Counted with the locks' other background calls: `crate::settle` waits for it.
        crate::serial::spawn_counted(Box::pin(async move {
            done.await;
            for i in members {
                let mut map = this.member(i);
                if map.get(&resource).is_some_and(|(mine, _, _)| *mine == id) {
                    map.remove(&resource);
                }
            }
        }));
    }

    /// Lets `rest` (what member `i`'s request on `resource` left to finish after answering)
    /// finish in the background; until it has, that member's next request on `resource`
    /// waits for it.
    pub(super) fn after(
        self: &std::sync::Arc<Self>,
        i: usize,
        resource: &str,
        rest: BoxFuture<'static, ()>,
    ) {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let done = rest.shared();
        self.member(i)
            .insert(resource.to_owned(), (id, done.clone(), true));
        let this = self.clone();
        let resource = resource.to_owned();
        crate::serial::spawn_counted(Box::pin(async move {
            done.await;
            let mut map = this.member(i);
            if map.get(&resource).is_some_and(|(mine, _, _)| *mine == id) {
                map.remove(&resource);
            }
        }));
    }

    /// Waits until everything detached so far has finished.
    pub(super) async fn settle(&self) {
        let all: Vec<Done> = (0..self.members.len())
            .flat_map(|i| {
                self.member(i)
                    .values()
                    .map(|(_, d, _)| d.clone())
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
