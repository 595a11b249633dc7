//! Scenarios for fair waiting, on stores that say they serve waiters in the order their waits
//! began ([`Capabilities::fair`](crate::store::Capabilities::fair)). Waiters are registered one
//! by one (each seen registered before the next starts: watched and refused, or shown waiting
//! in the store's queue, [`HolderInfo::waiting`](crate::store::HolderInfo)) and the order they
//! got in is checked, never timed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng as _;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::registry::{Observed, Registrations};
use super::{Harness, Outcome, require};
use crate::key::Mode;
use crate::lock::Lock;
use crate::lock::lockable::Lockable as _;

/// Whether the scenarios apply: a fair store that excludes, whose waiters are seen registered
/// (they wait through `watch`, or the store shows them).
fn fair(h: &Harness) -> bool {
    let caps = h.caps();
    let seen = !caps.blocking || (caps.introspection && h.shows_waiters);
    caps.fair && caps.excludes && seen
}

/// The harness on the store seen by a [`Registrations`].
fn observed(h: &Harness) -> (Harness, Arc<Registrations>) {
    let regs = Arc::new(Registrations::default());
    let mut seen = h.clone();
    seen.store = Arc::new(Observed {
        inner: h.store.clone(),
        regs: regs.clone(),
    });
    (seen, regs)
}

/// How often a scenario looks at the queue again while it waits for a waiter to show: the
/// condition is what it waits for, this only paces the looking.
const LOOK_AGAIN: Duration = Duration::from_millis(2);

/// Waits until exactly `n` waiters are seen registered on `r` (lock or semaphore).
async fn queued(h: &Harness, regs: &Registrations, r: &str, semaphore: bool, n: usize) {
    let what = format!("{n} waiters show in the queue of {r}");
    h.within(&what, async {
        loop {
            let shown = if semaphore {
                let listed = h.store.list(r).await.unwrap_or_default();
                listed
                    .iter()
                    .filter(|l| l.resource == r)
                    .flat_map(|l| l.holders.iter())
                    .filter(|x| x.waiting)
                    .count()
            } else {
                let holders = h.store.holders(r).await.unwrap_or_default();
                holders.iter().filter(|x| x.waiting).count()
            };
            if shown.max(regs.count(r)) == n {
                return;
            }
            tokio::time::sleep(LOOK_AGAIN).await;
        }
    })
    .await;
}

/// Who got in, in order, and a check that no two got in against each other.
#[derive(Default)]
struct Log {
    /// Writers and readers inside now.
    inside: Mutex<(u32, u32)>,
    entered: Mutex<Vec<usize>>,
}

impl Log {
    fn enter(&self, i: usize, mode: Mode) {
        let mut inside = self.inside.lock().unwrap();
        match mode {
            Mode::Write => {
                assert_eq!(*inside, (0, 0), "waiter {i} writes beside other holders");
                inside.0 += 1;
            }
            Mode::Read => {
                assert_eq!(inside.0, 0, "waiter {i} reads beside a writer");
                inside.1 += 1;
            }
        }
        self.entered.lock().unwrap().push(i);
    }

    fn leave(&self, mode: Mode) {
        let mut inside = self.inside.lock().unwrap();
        match mode {
            Mode::Write => inside.0 -= 1,
            Mode::Read => inside.1 -= 1,
        }
    }

    fn entered(&self) -> Vec<usize> {
        self.entered.lock().unwrap().clone()
    }
}

/// A waiter in its own task: it gets in (logged), stays a few yields, and releases; or it is
/// cancelled first (its acquire dropped). The task says whether it got in.
struct Waiter {
    cancel: Option<oneshot::Sender<()>>,
    task: JoinHandle<bool>,
}

impl Waiter {
    fn spawn(lock: Lock, mode: Mode, i: usize, log: Arc<Log>) -> Self {
        let (cancel, cancelled) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let acquire = async {
                match mode {
                    Mode::Write => lock.acquire().await,
                    Mode::Read => lock.acquire_read().await,
                }
            };
            tokio::select! {
                biased;
                _ = cancelled => return false,
                got = acquire => got.unwrap(),
            }
            log.enter(i, mode);
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            log.leave(mode);
            let _ = lock.release().await.unwrap();
            true
        });
        Waiter {
            cancel: Some(cancel),
            task,
        }
    }

    fn cancel(&mut self) {
        if let Some(tx) = self.cancel.take() {
            let _ = tx.send(());
        }
    }

    async fn finish(self, h: &Harness) -> bool {
        let _keep_until_done = self.cancel;
        h.within("the waiter finishes", self.task).await.unwrap()
    }
}

/// Checks that every pair of waiters that got in, one of them a writer, got in in the order
/// they arrived (readers next to each other may get in together, in any order).
fn assert_fifo(arrivals: &[(usize, Mode)], entered: &[usize]) {
    let pos = |i: usize| entered.iter().position(|&e| e == i);
    for (a, (ia, ma)) in arrivals.iter().enumerate() {
        for (ib, mb) in &arrivals[a + 1..] {
            if *ma == Mode::Read && *mb == Mode::Read {
                continue;
            }
            if let (Some(pa), Some(pb)) = (pos(*ia), pos(*ib)) {
                assert!(
                    pa < pb,
                    "waiter {ia} ({ma:?}) arrived before {ib} ({mb:?}) but got in after it: \
                     arrivals {arrivals:?}, entered {entered:?}"
                );
            }
        }
    }
}

/// Writers registered one by one while the lock is held get it in that order.
pub async fn fair_waiters_are_served_in_arrival_order(h: Harness) -> Outcome {
    require!(fair(&h), "the store does not serve waiters in order");
    let (h, regs) = observed(&h);
    let r = h.resource("fair-order");
    let holder = h.lock(&r, h.ttl);
    holder.acquire().await.unwrap();
    let log = Arc::new(Log::default());
    let mut waiters = Vec::new();
    for i in 0..6 {
        waiters.push(Waiter::spawn(
            h.lock(&r, h.ttl),
            Mode::Write,
            i,
            log.clone(),
        ));
        queued(&h, &regs, &r, false, i + 1).await;
    }
    let _ = holder.release().await.unwrap();
    for w in waiters {
        assert!(w.finish(&h).await, "every waiter gets in");
    }
    assert_eq!(
        log.entered(),
        (0..6).collect::<Vec<_>>(),
        "order of service"
    );
    Outcome::Ran
}

/// A writer waiting behind readers stops the readers that come after it: a newcomer reader's
/// try is refused, and the writer gets in before every reader that arrived after it.
pub async fn fair_a_writer_is_not_starved_by_readers(h: Harness) -> Outcome {
    require!(fair(&h), "the store does not serve waiters in order");
    let (h, regs) = observed(&h);
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("fair-writer");
    let reader = h.lock(&r, h.ttl);
    reader.acquire_read().await.unwrap();
    let log = Arc::new(Log::default());
    let mut waiters = vec![Waiter::spawn(
        h.lock(&r, h.ttl),
        Mode::Write,
        0,
        log.clone(),
    )];
    queued(&h, &regs, &r, false, 1).await;
    let newcomer = h.lock(&r, h.ttl);
    assert!(
        !newcomer.try_acquire_read().await.unwrap(),
        "a reader does not pass a waiting writer"
    );
    for i in 1..4 {
        waiters.push(Waiter::spawn(h.lock(&r, h.ttl), Mode::Read, i, log.clone()));
        queued(&h, &regs, &r, false, i + 1).await;
    }
    let _ = reader.release().await.unwrap();
    for w in waiters {
        assert!(w.finish(&h).await, "every waiter gets in");
    }
    let entered = log.entered();
    assert_eq!(entered.first(), Some(&0), "the writer first: {entered:?}");
    assert_eq!(entered.len(), 4, "{entered:?}");
    Outcome::Ran
}

/// A newcomer's try does not take a lock that a queued waiter is owed: refused right after the
/// release, admitted once the waiter has had its turn.
pub async fn fair_a_newcomer_does_not_pass_a_waiter(h: Harness) -> Outcome {
    require!(fair(&h), "the store does not serve waiters in order");
    let (h, regs) = observed(&h);
    let r = h.resource("fair-newcomer");
    let holder = h.lock(&r, h.ttl);
    holder.acquire().await.unwrap();
    let (got, got_rx) = oneshot::channel::<()>();
    let (go, go_rx) = oneshot::channel::<()>();
    let waiter = h.lock(&r, h.ttl);
    let task = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter.acquire().await.unwrap();
            got.send(()).unwrap();
            go_rx.await.unwrap();
            let _ = waiter.release().await.unwrap();
        }
    });
    queued(&h, &regs, &r, false, 1).await;
    let _ = holder.release().await.unwrap();
    // Whether the waiter has got in yet or not, the lock is not the newcomer's.
    let newcomer = h.lock(&r, h.ttl);
    assert!(
        !newcomer.try_acquire().await.unwrap(),
        "a newcomer's try does not pass the waiter"
    );
    if h.caps().shared {
        assert!(
            !newcomer.try_acquire_read().await.unwrap(),
            "nor does a newcomer reader"
        );
    }
    h.within("the waiter gets in", got_rx).await.unwrap();
    assert!(waiter.is_acquired().await.unwrap());
    go.send(()).unwrap();
    h.within("the waiter releases", task).await.unwrap();
    assert!(
        newcomer.try_acquire().await.unwrap(),
        "then the newcomer gets in"
    );
    let _ = newcomer.release().await.unwrap();
    Outcome::Ran
}

/// A waiter dropped while at the head leaves the queue at once and the next one gets in; so
/// does one dropped while its turn is coming (its release racing the drop): whatever it was
/// woken or granted for passes on, and it holds nothing.
pub async fn fair_a_dropped_head_does_not_stall_the_queue(h: Harness) -> Outcome {
    require!(fair(&h), "the store does not serve waiters in order");
    let (h, regs) = observed(&h);
    let r = h.resource("fair-dropped");
    let holder = h.lock(&r, h.ttl);
    for racing in [false, true] {
        holder.acquire().await.unwrap();
        let log = Arc::new(Log::default());
        let head_lock = h.lock(&r, h.ttl);
        let mut head = Waiter::spawn(head_lock.clone(), Mode::Write, 0, log.clone());
        queued(&h, &regs, &r, false, 1).await;
        let next = Waiter::spawn(h.lock(&r, h.ttl), Mode::Write, 1, log.clone());
        queued(&h, &regs, &r, false, 2).await;
        if racing {
            // Released and dropped at once: the head may be woken (or granted) first.
            let (released, ()) = tokio::join!(holder.release(), async { head.cancel() });
            let _ = released.unwrap();
        } else {
            head.cancel();
            queued(&h, &regs, &r, false, 1).await;
            let _ = holder.release().await.unwrap();
        }
        let head_got_in = head.finish(&h).await;
        if !racing {
            assert!(
                !head_got_in,
                "a head dropped before the release never gets in"
            );
        }
        assert!(
            next.finish(&h).await,
            "the next waiter gets in (racing: {racing})"
        );
        assert!(
            !head_lock.is_acquired().await.unwrap(),
            "the dropped head holds nothing"
        );
        assert!(!h.store.exists(head_lock.key()).await.unwrap().is_held());
    }
    // Nothing stalls the queue: a store may take a dropped waiter's ticket out in the
    // background, so a fresh holder waits (it would wait for ever behind a ticket left).
    let fresh = h.lock(&r, h.ttl);
    h.within("a fresh holder gets in", fresh.acquire())
        .await
        .unwrap();
    let _ = fresh.release().await.unwrap();
    Outcome::Ran
}

/// Random mixes of readers and writers, some dropped while they wait and some as the lock is
/// let go: never two holders against each other, and those that got in did so in the order
/// they arrived.
pub async fn fair_random_mixes_keep_exclusion_and_order(h: Harness) -> Outcome {
    require!(fair(&h), "the store does not serve waiters in order");
    let (h, regs) = observed(&h);
    let r = h.resource("fair-random");
    let holder = h.lock(&r, h.ttl);
    let mut next = 0;
    for _round in 0..6 {
        holder.acquire().await.unwrap();
        let log = Arc::new(Log::default());
        let mut waiters = Vec::new();
        let mut arrivals = Vec::new();
        for n in 0..8 {
            let read = h.caps().shared && rand::rng().random_bool(0.5);
            let mode = if read { Mode::Read } else { Mode::Write };
            waiters.push(Waiter::spawn(h.lock(&r, h.ttl), mode, next, log.clone()));
            arrivals.push((next, mode));
            next += 1;
            queued(&h, &regs, &r, false, n + 1).await;
        }
        let mut left = waiters.len();
        for w in &mut waiters {
            if rand::rng().random_bool(0.25) {
                w.cancel();
                left -= 1;
                queued(&h, &regs, &r, false, left).await;
            }
        }
        let _ = holder.release().await.unwrap();
        for w in &mut waiters {
            if rand::rng().random_bool(0.15) {
                w.cancel();
            }
        }
        for w in waiters {
            let _ = w.finish(&h).await;
        }
        assert_fifo(&arrivals, &log.entered());
    }
    // Nothing stalls the queue: a store may take a dropped waiter's ticket out in the
    // background, so a fresh holder waits (it would wait for ever behind a ticket left).
    let fresh = h.lock(&r, h.ttl);
    h.within("a fresh holder gets in", fresh.acquire())
        .await
        .unwrap();
    let _ = fresh.release().await.unwrap();
    Outcome::Ran
}

/// A semaphore's waiters are served in order: a head that needs more permits than are free is
/// not passed by a later waiter, nor by a newcomer, that would fit.
pub async fn fair_semaphore_waiters_are_served_in_order(h: Harness) -> Outcome {
    require!(fair(&h), "the store does not serve waiters in order");
    let (h, regs) = observed(&h);
    require!(h.caps().counting, "no counting semaphores");
    let r = h.resource("fair-sem");
    let make = |count: u32| {
        let s = h.factory().create_semaphore(&r, 2).expect("a valid limit");
        if count == 1 {
            s
        } else {
            s.permits(count).expect("a valid count")
        }
    };
    let (h1, h2) = (make(1), make(1));
    assert!(h1.try_acquire().await.unwrap() && h2.try_acquire().await.unwrap());
    let entered = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, count) in [(0usize, 2u32), (1, 1)] {
        let s = make(count);
        let entered = entered.clone();
        tasks.push(tokio::spawn(async move {
            s.acquire().await.unwrap();
            entered.lock().unwrap().push(i);
            let _ = s.release().await.unwrap();
        }));
        queued(&h, &regs, &r, true, i + 1).await;
    }
    let _ = h1.release().await.unwrap();
    let newcomer = make(1);
    assert!(
        !newcomer.try_acquire().await.unwrap(),
        "a newcomer does not pass a head that needs more than is free"
    );
    let _ = h2.release().await.unwrap();
    for t in tasks {
        h.within("the semaphore's waiters finish", t).await.unwrap();
    }
    assert_eq!(*entered.lock().unwrap(), vec![0, 1], "order of service");
    Outcome::Ran
}
