//! The per-holder executor: every store call a [`Lock`](crate::Lock) makes for a holder (other
//! than a native wait) runs here, one at a time per holder, in the order the calls were made,
//! and each runs to its end.
//!
//! A call is polled inline by its caller (no task, no channel on the hot path). A caller that
//! goes away stops waiting; the call does not stop: what is left of it moves to a task of its
//! own, still holding the holder's turn, so the holder's next call starts only once it has
//! ended. A call can see whether its caller left ([`Call::left`]) and then take back what it
//! stored, before anything else of the holder runs.
//!
//! Inside a call, a store can end the caller's wait early without ending the ordering:
//! [`within`] gives up waiting after a time limit and leaves the request to land (or fail)
//! after the call, and [`finish_later`] queues any other remainder there. The holder's next
//! call starts only once they have ended (each is bounded).
//!
//! Everything moved to a task is counted process-wide: [`settle`] waits for it, so that a
//! runtime about to end does not drop a clean-up unrun.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;

use crate::logging::TARGET;
use crate::mutex::lock;

pub(crate) type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// How much longer than its time limit (in limits) a request given up on by [`within`] may
/// take to land before it is dropped (its connection with it). Kept short: a holder's next call
/// waits for it, and on a paused server (a quorum member) each request waits out the last.
pub(crate) const LANDING: u32 = 1;

/// One holder's queue of calls: a ticket per call, taken when the call is made (so its place
/// is kept from then on), served in order.
#[derive(Default)]
pub(crate) struct Serial {
    queue: Arc<Queue>,
}

#[derive(Default)]
struct Queue {
    /// The next ticket to hand out.
    next: AtomicU64,
    /// The ticket whose call runs now (or may start).
    now: AtomicU64,
    /// Tickets given up before their turn came, passed over when it comes; `has_skipped` says
    /// (without the lock) whether there are any.
    skipped: Mutex<BTreeSet<u64>>,
    has_skipped: AtomicBool,
    /// Woken when the ticket served changes, if anyone waits (`waiting`).
    turned: Notify,
    waiting: AtomicUsize,
    /// How many calls have started; a native wait compares it before and after.
    started: AtomicU64,
    /// The ticket (plus one) of the call that took the turn last: whether a call began.
    running: AtomicU64,
    /// Tickets of calls that must run but whose callers left before they began: they start
    /// knowing it (`has_abandoned`: whether there are any, read without the lock).
    abandoned: Mutex<BTreeSet<u64>>,
    has_abandoned: AtomicBool,
    /// What the running call knows of itself: one record per holder, reset as each call
    /// starts (calls never overlap), so a call allocates nothing but its future.
    call: Arc<Call>,
}

// The uncontended path takes no lock: a ticket, one load, one store. Who advances `now` and
// who adds a skipped ticket (or a waiter) each write their own flag, then read the other's
// (sequentially consistent), so at least one of them sees the other and nothing is missed.
impl Queue {
    /// Waits until `ticket` is served; the turn ends when the returned value drops.
    async fn turn(self: Arc<Self>, ticket: u64) -> Turn {
        if self.now.load(Ordering::SeqCst) != ticket {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            loop {
                let turned = self.turned.notified();
                let mut turned = std::pin::pin!(turned);
                // Registered before the check, so a turn between the two is not missed.
                turned.as_mut().enable();
                if self.now.load(Ordering::SeqCst) == ticket {
                    break;
                }
                turned.await;
            }
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.started.fetch_add(1, Ordering::AcqRel);
        self.running.store(ticket + 1, Ordering::Release);
        let left = self.has_abandoned.load(Ordering::Acquire) && {
            let mut abandoned = lock(&self.abandoned);
            let left = abandoned.remove(&ticket);
            self.has_abandoned
                .store(!abandoned.is_empty(), Ordering::Release);
            left
        };
        self.call.left.store(left, Ordering::Release);
        self.call.has_after.store(false, Ordering::Release);
        Turn(self)
    }

    /// The call of `ticket`, whose turn it is, has ended: the next ticket is served.
    fn advance(&self, ticket: u64) {
        self.now.store(ticket + 1, Ordering::SeqCst);
        if self.has_skipped.load(Ordering::SeqCst) {
            self.pass_skipped();
        }
        self.wake();
    }

    /// `ticket` gives up its place before its turn came.
    fn skip(&self, ticket: u64) {
        {
            let mut skipped = lock(&self.skipped);
            skipped.insert(ticket);
            self.has_skipped.store(true, Ordering::SeqCst);
        }
        self.pass_skipped();
        self.wake();
    }

    /// Passes over the skipped tickets whose turn has come.
    fn pass_skipped(&self) {
        let mut skipped = lock(&self.skipped);
        loop {
            let now = self.now.load(Ordering::SeqCst);
            if !skipped.remove(&now) {
                break;
            }
            self.now.store(now + 1, Ordering::SeqCst);
        }
        self.has_skipped
            .store(!skipped.is_empty(), Ordering::SeqCst);
    }

    fn wake(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.turned.notify_waiters();
        }
    }
}

/// A holder's turn: the next call starts when it drops.
struct Turn(Arc<Queue>);

impl Drop for Turn {
    fn drop(&mut self) {
        // Only the call whose turn it is advances `now`: it is this one's ticket.
        let now = self.0.now.load(Ordering::SeqCst);
        self.0.advance(now);
    }
}

impl Serial {
    /// How many calls of this holder have started so far.
    pub(crate) fn started(&self) -> u64 {
        self.queue.started.load(Ordering::Acquire)
    }
}

/// Whether a call whose caller left before it started still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// Only if its caller still waits when its turn comes (a try, a check, a refresh).
    IfAwaited,
    /// Always (a release, a clean-up: once asked for, it happens).
    Always,
}

/// What a running call knows of itself.
#[derive(Default)]
pub(crate) struct Call {
    left: AtomicBool,
    /// Remainders to finish after the call, in order, before the holder's next call
    /// (`has_after`: whether any were ever queued, read without the lock).
    after: Mutex<Vec<Boxed<()>>>,
    has_after: AtomicBool,
}

impl Call {
    /// Whether the caller stopped waiting for this call.
    pub(crate) fn left(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }
}

tokio::task_local! {
    static CURRENT: Arc<Call>;
}

/// A call on a holder's executor: polled by its caller; dropped unfinished, it finishes in a
/// task of its own (or, if it had not started and may be skipped, never runs).
pub(crate) struct Running<T: Send + 'static> {
    inner: Option<Boxed<T>>,
    start: Start,
    queue: Arc<Queue>,
    ticket: u64,
}

/// Queues `body` on `serial`: it starts when every call queued before it has ended (their
/// remainders included), and is told of itself.
pub(crate) fn run<T, F, Fut>(serial: &Serial, start: Start, body: F) -> Running<T>
where
    T: Send + 'static,
    F: FnOnce(Arc<Call>) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let queue = serial.queue.clone();
    let ticket = queue.next.fetch_add(1, Ordering::AcqRel);
    let q = queue.clone();
    let inner = async move {
        let c = q.call.clone();
        // A call that completes at once (an uncontended lock in memory) still spends the
        // task's scheduling budget, as a lock's mutex would: a loop of such calls yields to the
        // runtime now and then instead of starving its other tasks.
        tokio::task::coop::consume_budget().await;
        let guard = q.turn(ticket).await;
        let out = CURRENT.scope(c.clone(), body(c.clone())).await;
        finish_after(c, guard);
        out
    };
    Running {
        inner: Some(Box::pin(inner)),
        start,
        queue,
        ticket,
    }
}

/// Runs what the call left to finish, holding the turn until the last of it has ended.
fn finish_after(call: Arc<Call>, guard: Turn) {
    if let Some(rest) = remainders(call) {
        spawn_counted(Box::pin(async move {
            let _turn = guard;
            rest.await;
        }));
    }
}

/// What `call` left to finish, as one future running it in order (remainders queued by
/// remainders included); `None` when it left nothing.
fn remainders(call: Arc<Call>) -> Option<Boxed<()>> {
    if !call.has_after.load(Ordering::Acquire) {
        return None;
    }
    let take = |call: &Call| std::mem::take(&mut *lock(&call.after));
    let first = take(&call);
    if first.is_empty() {
        return None;
    }
    Some(Box::pin(async move {
        let mut next = first;
        while !next.is_empty() {
            for remainder in next {
                CURRENT.scope(call.clone(), remainder).await;
            }
            next = take(&call);
        }
    }))
}

impl<T: Send + 'static> Future for Running<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Pending; // polled after completion: never again ready
        };
        match inner.as_mut().poll(cx) {
            Poll::Ready(out) => {
                self.inner = None;
                Poll::Ready(out)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for Running<T> {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        let began = self.queue.running.load(Ordering::Acquire) == self.ticket + 1;
        if self.start == Start::IfAwaited && !began {
            // Not begun: it gives up its place.
            drop(inner);
            self.queue.skip(self.ticket);
            return;
        }
        if began {
            // It runs now (unfinished, it still holds the turn): the record is its own.
            self.queue.call.left.store(true, Ordering::Release);
        } else {
            // It starts later (in its own task), told then that its caller left.
            let mut abandoned = lock(&self.queue.abandoned);
            abandoned.insert(self.ticket);
            self.queue.has_abandoned.store(true, Ordering::Release);
        }
        spawn_counted(Box::pin(async move {
            inner.await;
        }));
    }
}

/// Waits for `fut` at most `limit`: its output, or `None` when the limit passed. A future
/// given up on is not dropped: it finishes after the current call (bounded by [`LANDING`]
/// times the limit), so that what it may still do lands before the holder's next call.
pub(crate) async fn within<T: Send + 'static>(
    limit: Duration,
    fut: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let mut fut: Boxed<T> = Box::pin(fut);
    match tokio::time::timeout(limit, &mut fut).await {
        Ok(out) => Some(out),
        Err(_) => {
            finish_later(async move {
                if tokio::time::timeout(limit * LANDING, fut).await.is_err() {
                    tracing::debug!(target: TARGET, ?limit,
                        "a request given up on did not land in time; dropped");
                }
            });
            None
        }
    }
}

/// Queues `remainder` to run after the current call, before the holder's next one; outside
/// any call (a store used on its own), it runs in a task of its own. Either way [`settle`]
/// waits for it.
pub(crate) fn finish_later(remainder: impl Future<Output = ()> + Send + 'static) {
    let mut slot = Some(Box::pin(remainder) as Boxed<()>);
    let _ = CURRENT.try_with(|call| {
        if let Some(r) = slot.take() {
            lock(&call.after).push(r);
            call.has_after.store(true, Ordering::Release);
        }
    });
    if let Some(r) = slot {
        spawn_counted(r);
    }
}

/// Completes once the caller of the current call has stopped waiting for it (looked at every
/// 10 ms); never outside a call. A store races what it has not sent yet (a connection being
/// opened) against it: nobody waits for the answer any more, and nothing needs undoing.
pub(crate) async fn caller_left() {
    let Ok(call) = CURRENT.try_with(Arc::clone) else {
        return std::future::pending().await;
    };
    while !call.left() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `fut` in a call scope of its own and gives back, with its output, what it left to
/// finish (its [`within`] and [`finish_later`] remainders, in order) instead of queueing it on
/// the current call: for a store that fans one call out to several others (a quorum), so that
/// each member's remainders are ordered before that member's next request alone.
pub(crate) async fn gather<T>(fut: impl Future<Output = T>) -> (T, Option<Boxed<()>>) {
    let call = Arc::new(Call::default());
    let out = CURRENT.scope(call.clone(), fut).await;
    (out, remainders(call))
}

/// Runs `fut` as if its caller waited for it, in a call scope of its own (whose caller never
/// leaves), then what it left to finish: for a store call that must not be given up on when
/// nobody waits (the minimum hold's release of a dropped guard).
pub(crate) async fn attended<T>(fut: impl Future<Output = T>) -> T {
    let (out, rest) = gather(fut).await;
    if let Some(rest) = rest {
        rest.await;
    }
    out
}

/// How long the one-off runtime of a call dropped outside any runtime waits for what the
/// call left to finish.
const OUTSIDE_SETTLE: Duration = Duration::from_secs(30);

/// Tasks this module started and not finished, process-wide.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// Woken when the last pending task finishes.
static SETTLED: Notify = Notify::const_new();

/// Waits (at most `within`) until no store call that a lock started in this process is still
/// running; `true` when none is.
///
/// A lock's store call, once started, runs to its end even if its caller stops waiting for it:
/// a dropped acquire's clean-up, a dropped guard's release, a request given up on at a store
/// timeout that may still land. They run on the tokio runtime. A program that ends its runtime
/// (or returns from `main`) drops whatever still runs, and a lock that a clean-up would have
/// taken back stays stored until its ttl ends: call this first (the blocking API and the
/// command-line tool do). See [`LockFactory::shutdown`](crate::LockFactory::shutdown).
///
/// # Cancel safety
///
/// Cancel-safe: it only waits; what it waits for goes on.
pub async fn settle(within: Duration) -> bool {
    tokio::time::timeout(within, async {
        loop {
            let woken = SETTLED.notified();
            let mut woken = std::pin::pin!(woken);
            // Registered before the check, so a finish between the two is not missed.
            woken.as_mut().enable();
            if PENDING.load(Ordering::SeqCst) == 0 {
                return;
            }
            woken.await;
        }
    })
    .await
    .is_ok()
}

/// Runs `fut` in a task of its own, counted until it ends (or is dropped unrun).
pub(crate) fn spawn_counted(fut: Pin<Box<dyn Future<Output = ()> + Send + 'static>>) {
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            if PENDING.fetch_sub(1, Ordering::SeqCst) == 1 {
                SETTLED.notify_waiters();
            }
        }
    }
    PENDING.fetch_add(1, Ordering::SeqCst);
    let done = Done;
    let task = async move {
        let _done = done;
        fut.await;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(task);
        }
        Err(_) => {
            // Dropped outside any runtime: a one-off thread finishes it.
            let spawned = std::thread::Builder::new()
                .name("xtr-lock-finish".into())
                .spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        // What the call leaves to finish is spawned on this runtime: it
                        // runs before the runtime goes (bounded, as every landing is).
                        Ok(rt) => rt.block_on(async {
                            task.await;
                            settle(OUTSIDE_SETTLE).await;
                        }),
                        Err(err) => tracing::warn!(target: TARGET, error = %err,
                            "cannot start a runtime to finish a lock's store call"),
                    }
                });
            if let Err(err) = spawned {
                tracing::warn!(target: TARGET, error = %err,
                    "cannot start a thread to finish a lock's store call");
            }
        }
    }
}

#[cfg(test)]
mod tests;
