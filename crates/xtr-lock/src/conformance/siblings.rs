//! Sibling chaos: several tasks share each of several [`Lock`]s (clones of one lock are one
//! holder), and the holders contend for one resource. Each task loops over random tries, timed
//! and untimed acquires (dropped at random points by a timer), promotions, demotions, releases
//! and checks. A checker holds the store to what it reports:
//!
//! - a holder just granted a write lock, while no sibling call that could end or weaken its
//!   hold was under way, is the only holder the store knows (`exists` of every holder's key,
//!   `holders()` where the store tells), and its fencing token is above every earlier writer's;
//! - at the quiet point after each round, a holder that believes it holds does hold, per the
//!   store, and the store's holders exclude each other;
//! - once every holder released, nothing is left held;
//! - no try, check or release of a holder blocks behind a sibling's wait (each is bounded).
//!
//! `XTR_CHAOS_SEED` replays a seed (printed on failure; the tasks still race, so a replay is
//! likely, not certain, to take the same path); `XTR_CHAOS_ROUNDS` (default 2, of about 0.7 s
//! each) makes the run longer.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use super::{Harness, Outcome, require};
use crate::key::Mode;
use crate::lock::Lock;
use crate::lock::lockable::Lockable as _;
use crate::store::{HolderInfo, Holding};

/// Holders contending for the resource.
const HOLDERS: usize = 3;
/// Tasks sharing each holder's lock.
const SIBLINGS: usize = 3;
/// How long the tasks run between two quiet points.
const ROUND: Duration = Duration::from_millis(700);

/// Several tasks per `Lock`, several `Lock`s on one resource, random calls dropped at random
/// points; the store's own answers must show mutual exclusion throughout, agree with what the
/// holders believe at quiet points, show nothing held at the end, and no call of a holder may
/// wait behind a sibling's wait.
pub async fn siblings_chaos_keeps_exclusion_and_leaves_nothing(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let seed = std::env::var("XTR_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let rounds: u64 = std::env::var("XTR_CHAOS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    eprintln!("sibling chaos: XTR_CHAOS_SEED={seed} XTR_CHAOS_ROUNDS={rounds}");
    let _note = SeedNote(seed);
    let chaos = Arc::new(Chaos::new(h, seed));
    for round in 0..rounds {
        chaos.clone().run_round(round).await;
        chaos.quiet_check(round).await;
    }
    chaos.release_all_and_check_nothing_is_left().await;
    eprintln!(
        "sibling chaos: {} write grants checked against the store",
        chaos.verified.load(SeqCst)
    );
    Outcome::Ran
}

/// Prints the seed when the scenario fails.
struct SeedNote(u64);

impl Drop for SeedNote {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("sibling chaos failed: rerun with XTR_CHAOS_SEED={}", self.0);
        }
    }
}

/// One holder: the lock its sibling tasks share, and what the checker knows of their calls.
struct Holder {
    lock: Lock,
    /// Sibling calls under way that may end or weaken the hold (release, read locks, and
    /// promotions where those exist: flock's promotion drops the read lock first).
    weakening: AtomicUsize,
    /// Bumped as each such call starts and ends.
    epoch: AtomicU64,
    /// Until when (ms since the start) a dropped such call may still act in the store.
    tainted_until: AtomicU64,
}

struct Chaos {
    h: Harness,
    resource: String,
    holders: Vec<Holder>,
    seed: u64,
    started: Instant,
    /// How long a call that must not wait may take: 5 s on the store's time scale.
    bound: Duration,
    /// How long a dropped call may go on acting in the store.
    settle: Duration,
    /// The highest write token a checked writer showed, and whose it was.
    fence: Mutex<Option<(u64, usize)>>,
    verified: AtomicUsize,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    TryWrite,
    TimedWrite(Duration),
    Write(Duration),
    TryRead,
    TimedRead(Duration),
    Read(Duration),
    Release,
    Check,
}

#[derive(Debug)]
enum Done {
    Granted,
    Refused,
    Dropped,
    Failed,
    Other,
}

impl Op {
    fn writes(self) -> bool {
        matches!(self, Op::TryWrite | Op::TimedWrite(_) | Op::Write(_))
    }

    fn weakens(self, shared: bool) -> bool {
        match self {
            Op::Release | Op::TryRead | Op::TimedRead(_) | Op::Read(_) => true,
            Op::TryWrite | Op::TimedWrite(_) | Op::Write(_) => shared,
            Op::Check => false,
        }
    }
}

/// Marks a weakening call under way; on drop (returned or cancelled) it bumps the epoch, and a
/// call that did not finish taints the holder for the settling time.
struct Weakening<'a> {
    chaos: &'a Chaos,
    holder: &'a Holder,
    finished: bool,
}

impl<'a> Weakening<'a> {
    fn start(chaos: &'a Chaos, holder: &'a Holder) -> Self {
        holder.epoch.fetch_add(1, SeqCst);
        holder.weakening.fetch_add(1, SeqCst);
        Weakening {
            chaos,
            holder,
            finished: false,
        }
    }
}

impl Drop for Weakening<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let until = self.chaos.now_ms() + self.chaos.settle.as_millis() as u64;
            self.holder.tainted_until.fetch_max(until, SeqCst);
        }
        self.holder.epoch.fetch_add(1, SeqCst);
        self.holder.weakening.fetch_sub(1, SeqCst);
    }
}

/// How many more times a write grant's check lists the holders while the listing shows more
/// than the writer (see `Chaos::listed_alone`).
const RELIST: usize = 10;

impl Chaos {
    fn new(h: Harness, seed: u64) -> Self {
        let resource = h.resource("siblings");
        let holders = (0..HOLDERS)
            .map(|_| Holder {
                lock: h.lock(&resource, h.ttl),
                weakening: AtomicUsize::new(0),
                epoch: AtomicU64::new(0),
                tainted_until: AtomicU64::new(0),
            })
            .collect();
        Chaos {
            bound: h.time(Duration::from_secs(5)),
            settle: h.time(Duration::from_millis(300)),
            h,
            resource,
            holders,
            seed,
            started: Instant::now(),
            fence: Mutex::new(None),
            verified: AtomicUsize::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The holder's epoch, if no call that could weaken its hold is under way or settling.
    fn gate(&self, i: usize) -> Option<u64> {
        let holder = &self.holders[i];
        let quiet = holder.weakening.load(SeqCst) == 0
            && holder.tainted_until.load(SeqCst) <= self.now_ms();
        quiet.then(|| holder.epoch.load(SeqCst))
    }

    /// Awaits a call that must not wait behind a sibling: it must end within the bound
    /// (plus `extra`, a timed call's own wait).
    async fn bounded<T>(&self, what: &str, extra: Duration, fut: impl Future<Output = T>) -> T {
        match tokio::time::timeout(self.bound + extra, fut).await {
            Ok(v) => v,
            Err(_) => panic!(
                "{what} did not return within {:?}: blocked behind a sibling's wait \
                 (XTR_CHAOS_SEED={})",
                self.bound + extra,
                self.seed
            ),
        }
    }

    async fn run_round(self: Arc<Self>, round: u64) {
        let end = Instant::now() + ROUND;
        let mut tasks = Vec::new();
        for i in 0..HOLDERS {
            for s in 0..SIBLINGS {
                let chaos = self.clone();
                let salt = (round * 1_000 + (i * SIBLINGS + s) as u64).wrapping_mul(0x9E37_79B9);
                let mut rng = StdRng::seed_from_u64(self.seed ^ salt);
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < end {
                        chaos.step(i, &mut rng).await;
                        let pause = rng.random_range(0..8);
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                }));
            }
        }
        for task in tasks {
            let joined = self.h.within("a chaos task ends its round", task).await;
            if let Err(e) = joined {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }

    fn pick(&self, rng: &mut StdRng) -> Op {
        let wait = Duration::from_millis(rng.random_range(0..=120));
        let wait = self.h.time(wait);
        let shared = self.h.caps().shared;
        match rng.random_range(0..if shared { 10 } else { 7 }) {
            0 | 1 => Op::TryWrite,
            2 => Op::TimedWrite(wait),
            3 => Op::Write(wait),
            4 | 5 => Op::Release,
            6 => Op::Check,
            7 => Op::TryRead,
            8 => Op::TimedRead(wait),
            _ => Op::Read(wait),
        }
    }

    async fn step(&self, i: usize, rng: &mut StdRng) {
        let op = self.pick(rng);
        let holder = &self.holders[i];
        let weak = op.weakens(self.h.caps().shared);
        // This call's own start and end bump the epoch too.
        let gate = self.gate(i).map(|e| e + if weak { 2 } else { 0 });
        let done = if weak {
            let mut mark = Weakening::start(self, holder);
            let done = self.call(&holder.lock, op).await;
            mark.finished = !matches!(done, Done::Dropped | Done::Failed);
            done
        } else {
            self.call(&holder.lock, op).await
        };
        if op.writes() && matches!(done, Done::Granted) {
            self.check_write_grant(i, gate).await;
        }
    }

    async fn call(&self, lock: &Lock, op: Op) -> Done {
        let zero = Duration::ZERO;
        let granted = |r: crate::Result<bool>| match r {
            Ok(true) => Done::Granted,
            Ok(false) => Done::Refused,
            Err(_) => Done::Failed,
        };
        let sleep = |d| tokio::time::sleep(d);
        match op {
            Op::TryWrite => granted(self.bounded("try_acquire", zero, lock.try_acquire()).await),
            Op::TryRead => granted(
                self.bounded("try_acquire_read", zero, lock.try_acquire_read())
                    .await,
            ),
            Op::TimedWrite(d) => granted(
                self.bounded("acquire_timeout", d, lock.acquire_timeout(d))
                    .await,
            ),
            Op::TimedRead(d) => granted(
                self.bounded("acquire_read_timeout", d, lock.acquire_read_timeout(d))
                    .await,
            ),
            Op::Write(d) => tokio::select! {
                r = lock.acquire() => granted(r.map(|()| true)),
                () = sleep(d) => Done::Dropped,
            },
            Op::Read(d) => tokio::select! {
                r = lock.acquire_read() => granted(r.map(|()| true)),
                () = sleep(d) => Done::Dropped,
            },
            Op::Release => match self.bounded("release", zero, lock.release()).await {
                Ok(_) => Done::Other,
                Err(_) => Done::Failed,
            },
            Op::Check => match self.bounded("is_acquired", zero, lock.is_acquired()).await {
                Ok(_) => Done::Other,
                Err(_) => Done::Failed,
            },
        }
    }

    /// What the store says of every holder's key.
    async fn holdings(&self) -> Vec<Holding> {
        let mut out = Vec::with_capacity(self.holders.len());
        for holder in &self.holders {
            let exists = self.h.store.exists(holder.lock.key());
            out.push(
                self.bounded("exists", Duration::ZERO, exists)
                    .await
                    .unwrap(),
            );
        }
        out
    }

    /// The holders the store lists (not those queued), where it can tell.
    async fn listed(&self) -> Option<Vec<HolderInfo>> {
        if !self.h.caps().introspection {
            return None;
        }
        let all = self.h.store.holders(&self.resource);
        let all = self.bounded("holders", Duration::ZERO, all).await.unwrap();
        Some(all.into_iter().filter(|x| !x.waiting).collect())
    }

    /// What the store lists while a holder holds a write lock, looked at again (up to
    /// `RELIST` times) while it lists more than one writer. A listing is a snapshot: on pub/sub
    /// a reader announces itself before it looks for a writer (portalocker's protocol) and
    /// drops out on seeing one, so another holder's attempt may show for a moment as a reader;
    /// it is gone at the next look, a lock held beside the writer is not.
    async fn listed_alone(&self) -> Option<Vec<HolderInfo>> {
        let mut listed = self.listed().await;
        for _ in 0..RELIST {
            match &listed {
                Some(l) if !(l.len() == 1 && l[0].mode == Mode::Write) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    listed = self.listed().await;
                }
                _ => break,
            }
        }
        listed
    }

    /// Holder `i` was just granted a write lock. If no sibling call that could end or weaken
    /// the hold ran from before the call until after the store was asked, the store must say
    /// `i` holds alone, and its token must be above every earlier writer's.
    async fn check_write_grant(&self, i: usize, gate: Option<u64>) {
        if gate.is_none() {
            return;
        }
        let holdings = self.holdings().await;
        let listed = self.listed_alone().await;
        let fenced = match self.holders[i].lock.fencing_token() {
            Some(t) if self.h.caps().fencing => self.apply_token(i, t),
            _ => Ok(()),
        };
        if self.gate(i) != gate {
            return;
        }
        let seed = self.seed;
        assert_eq!(
            holdings[i],
            Holding::Held(Mode::Write),
            "holder {i} was granted a write lock and no sibling let go since, but the store says \
             it holds {:?} (all holders: {holdings:?}; XTR_CHAOS_SEED={seed})",
            holdings[i]
        );
        let others: Vec<usize> = (0..holdings.len())
            .filter(|&j| j != i && holdings[j].is_held())
            .collect();
        assert!(
            others.is_empty(),
            "holder {i} was granted a write lock, and the store says holders {others:?} hold \
             too: {holdings:?} (XTR_CHAOS_SEED={seed})"
        );
        if let Some(listed) = listed {
            assert!(
                listed.len() == 1 && listed[0].mode == Mode::Write,
                "holder {i} was granted a write lock; the store lists {listed:?} \
                 (XTR_CHAOS_SEED={seed})"
            );
        }
        if let Err(why) = fenced {
            panic!("{why} (XTR_CHAOS_SEED={seed})");
        }
        self.verified.fetch_add(1, SeqCst);
    }

    /// A fenced resource: refuses a write token below the highest seen, or equal to another
    /// holder's.
    fn apply_token(&self, i: usize, token: u64) -> Result<(), String> {
        let mut fence = self.fence.lock().unwrap();
        match *fence {
            Some((max, who)) if token < max => Err(format!(
                "holder {i}'s write token {token} is below holder {who}'s {max}: tokens went back"
            )),
            Some((max, who)) if token == max && who != i => Err(format!(
                "holders {who} and {i} were both granted write token {token}"
            )),
            _ => {
                *fence = Some((token, i));
                Ok(())
            }
        }
    }

    /// Whether holder `i`, whose lock the store no longer has, learns so within 2 s (real
    /// time). A lock can go between two looks (on pub/sub a subscription whose health check a
    /// loaded machine answered late is lost), and its loss reaches the holder through its
    /// monitor, a moment after the store knows.
    async fn loss_reported(&self, i: usize) -> bool {
        for _ in 0..100 {
            if self.holders[i].lock.held_mode().is_none() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// After a round, once dropped calls had time to settle: a holder that believes it holds
    /// does hold per the store, and the store's holders exclude each other.
    async fn quiet_check(&self, round: u64) {
        self.h.sleep(self.settle).await;
        let holdings = self.holdings().await;
        let seed = self.seed;
        for (i, holder) in self.holders.iter().enumerate() {
            if let Some(mode) = holder.lock.held_mode() {
                assert!(
                    holdings[i].is_held() || self.loss_reported(i).await,
                    "after round {round}: holder {i} believes it holds ({mode:?}) but the store \
                     says {:?}, and the holder was not told within 2 s (XTR_CHAOS_SEED={seed})",
                    holdings[i]
                );
            }
        }
        let writers = holdings
            .iter()
            .filter(|x| **x == Holding::Held(Mode::Write))
            .count();
        let held = holdings.iter().filter(|x| x.is_held()).count();
        assert!(
            writers == 0 || held == 1,
            "after round {round}: a writer beside other holders: {holdings:?} \
             (XTR_CHAOS_SEED={seed})"
        );
        if let Some(listed) = self.listed().await {
            let listed_writers = listed.iter().filter(|x| x.mode == Mode::Write).count();
            assert!(
                listed_writers == 0 || listed.len() == 1,
                "after round {round}: the store lists a writer beside others: {listed:?} \
                 (XTR_CHAOS_SEED={seed})"
            );
        }
    }

    /// Every holder releases; then, within the patience, nothing is held (every key, the
    /// store's list) and a new holder gets the lock at once.
    async fn release_all_and_check_nothing_is_left(&self) {
        for holder in &self.holders {
            let _ = self
                .bounded("the final release", Duration::ZERO, holder.lock.release())
                .await;
        }
        let deadline = Instant::now() + self.h.patience;
        loop {
            let holdings = self.holdings().await;
            let listed = self.listed().await.unwrap_or_default();
            let fresh = self.h.lock(&self.resource, self.h.ttl);
            let free = holdings.iter().all(|x| !x.is_held())
                && listed.is_empty()
                && fresh.try_acquire().await.unwrap_or(false);
            if free {
                let _ = fresh.release().await.unwrap();
                return;
            }
            let _ = fresh.release().await;
            assert!(
                Instant::now() < deadline,
                "every holder released, but after {:?} the store still says {holdings:?} and \
                 lists {listed:?} (XTR_CHAOS_SEED={})",
                self.h.patience,
                self.seed
            );
            self.h.sleep(Duration::from_millis(50)).await;
        }
    }
}
