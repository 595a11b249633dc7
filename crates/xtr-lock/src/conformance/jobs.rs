//! Scenarios for scheduled jobs: minimum and maximum holds, bounded renewals, revocation and
//! the overlap policies.

use std::time::{Duration, Instant};

use super::{Harness, Outcome, require};
use crate::error::{Error, LostReason};
use crate::key::Mode;
use crate::lock::Lock;
use crate::lock::factory::RunOptions;
use crate::lock::lockable::{Lockable as _, Release, Wait};
use crate::lock::policy::OnConflict;
use crate::lock::revoke::{QUEUE_SUFFIX, REVOKE_SUFFIX};

/// How much sooner than asked a hold may seem to end, measured here around the store's calls.
const SLACK: Duration = Duration::from_millis(50);

/// Polls `lock.try_acquire` until it succeeds; when it did, from `since`.
async fn acquired_after(h: &Harness, lock: &Lock, since: Instant) -> Duration {
    h.within("the lock came free", async {
        while !lock.try_acquire().await.unwrap() {
            h.sleep(Duration::from_millis(25)).await;
        }
    })
    .await;
    since.elapsed()
}

/// Runs a body that never ends under `options` on `r`; the error that ended it.
async fn run_forever(h: &Harness, r: &str, options: RunOptions) -> Error {
    let factory = h.factory();
    let ended = factory
        .run(r, options, || async {
            std::future::pending::<()>().await;
            Ok::<(), Error>(())
        })
        .await;
    ended.expect_err("a body that never ends is stopped")
}

/// A scope on `r` whose body never ends, once it holds (its ttl, where locks expire, long
/// enough that a loaded machine does not let it run out between renewals): its task, which
/// ends with the error that stopped it, and that ttl.
async fn holding_forever(
    h: &Harness,
    r: &str,
) -> (tokio::task::JoinHandle<Error>, Option<Duration>) {
    let ttl = h.ttl.map(|_| h.time(Duration::from_secs(3)));
    let holder = tokio::spawn({
        let (h, r) = (h.clone(), r.to_owned());
        async move { run_forever(&h, &r, RunOptions::new().ttl(ttl)).await }
    });
    h.within("the holder took the lock", async {
        while h.store.holders(r).await.unwrap().is_empty() {
            h.sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    (holder, ttl)
}

/// A holder released before its minimum hold keeps others out until the hold has lasted that
/// long: where locks expire on the store's clock the release returns at once, elsewhere it
/// holds on until then.
pub async fn a_minimum_hold_keeps_others_out_after_the_release(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("min-hold");
    let min = h.time(Duration::from_millis(750));
    let lock = h.lock(&r, h.ttl).with_min_hold(min);
    let since = Instant::now();
    assert!(lock.try_acquire().await.unwrap());
    let released = Instant::now();
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    let caps = h.caps();
    if caps.expiring && !caps.leased {
        assert!(
            released.elapsed() < min / 2,
            "the release left the lock to the store's clock, took {:?}",
            released.elapsed()
        );
    }
    assert_eq!(lock.held_mode(), None);
    let other = h.lock(&r, h.ttl);
    assert!(
        since.elapsed() >= min || !other.try_acquire().await.unwrap(),
        "another holder is kept out during the minimum hold"
    );
    let took = acquired_after(&h, &other, since).await;
    assert!(took + SLACK >= min, "free after {took:?}, before {min:?}");
    let _ = other.release().await.unwrap();

    // Held longer than the minimum: the release lets go at once.
    let late = h.lock(&r, h.ttl).with_min_hold(Duration::from_millis(1));
    assert!(late.try_acquire().await.unwrap());
    h.sleep(Duration::from_millis(5)).await;
    assert_eq!(late.release().await.unwrap(), Release::Released);
    assert!(
        other.try_acquire().await.unwrap(),
        "no minimum left: free at once"
    );
    let _ = other.release().await.unwrap();
    Outcome::Ran
}

/// A scope held past its maximum hold is stopped with `HeldTooLong`, and the lock released.
pub async fn a_maximum_hold_stops_the_body_and_releases(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("max-hold");
    let max = h.time(Duration::from_millis(400));
    let started = Instant::now();
    let options = RunOptions::new().ttl(h.ttl).max_hold(max);
    let err = h
        .within(
            "the body stopped at its maximum hold",
            run_forever(&h, &r, options),
        )
        .await;
    assert_eq!(err.lost_reason(), Some(LostReason::HeldTooLong), "{err}");
    assert!(started.elapsed() + SLACK >= max, "{:?}", started.elapsed());
    let other = h.lock(&r, h.ttl);
    assert!(
        other.try_acquire().await.unwrap(),
        "released after the maximum"
    );
    let _ = other.release().await.unwrap();
    Outcome::Ran
}

/// A lock renewed as often as it may be ends its hold when the next renewal is due.
pub async fn bounded_renewals_end_the_hold(h: Harness) -> Outcome {
    require!(
        h.caps().expiring,
        "locks here do not expire: nothing is renewed"
    );
    let r = h.resource("max-renewals");
    let ttl = h.time(Duration::from_millis(600));
    // The lease the store really keeps for that ttl (whole seconds, on some), renewed at a
    // third of it.
    let probe = h.lock(&h.resource("lease"), Some(ttl));
    assert!(probe.try_acquire().await.unwrap());
    let lease = probe
        .remaining_lifetime()
        .expect("an expiring lock has a lifetime");
    let _ = probe.release().await.unwrap();
    let lock = h.lock(&r, Some(ttl)).with_max_renewals(2);
    let started = Instant::now();
    let body = lock.scoped(async {
        std::future::pending::<()>().await;
        Ok::<(), Error>(())
    });
    let ended = h.within("the hold ended after its renewals", body).await;
    let err = ended.expect_err("stopped after its renewals");
    assert_eq!(err.lost_reason(), Some(LostReason::HeldTooLong), "{err}");
    // Two renewals, and the hold ends when the third is due: three periods.
    let took = started.elapsed();
    assert!(took + SLACK >= lease / 3 * 3, "{took:?}, lease {lease:?}");
    let other = h.lock(&r, h.ttl);
    assert!(other.try_acquire().await.unwrap(), "released at the end");
    let _ = other.release().await.unwrap();
    Outcome::Ran
}

/// A minimum hold holds on every way out: a dropped guard, and a released holder can neither
/// renew nor find the lock it left to run out.
pub async fn a_minimum_hold_outlives_a_dropped_guard(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("min-hold-guard");
    let min = h.time(Duration::from_millis(750));
    let lock = h.lock(&r, h.ttl).with_min_hold(min);
    let since = Instant::now();
    let guard = lock.lock().await.unwrap();
    drop(guard);
    let other = h.lock(&r, h.ttl);
    let took = acquired_after(&h, &other, since).await;
    assert!(took + SLACK >= min, "free after {took:?}, before {min:?}");
    let _ = other.release().await.unwrap();

    let lock = h.lock(&r, h.ttl).with_min_hold(min);
    let since = Instant::now();
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert!(
        !lock.is_acquired().await.unwrap(),
        "the released holder holds nothing"
    );
    if let Some(ttl) = h.ttl {
        let err = lock.refresh(Some(ttl)).await.unwrap_err();
        assert!(
            !err.is_temporary(),
            "a refresh of nothing is refused: {err}"
        );
    }
    let took = acquired_after(&h, &other, since).await;
    assert!(took + SLACK >= min, "free after {took:?}, before {min:?}");
    let _ = other.release().await.unwrap();
    Outcome::Ran
}

/// A holder whose lock is revoked is told (its body stopped with `Revoked`) and lets go; the
/// revoker learns that it did, and takes its notice down.
pub async fn a_revoked_holder_gives_its_lock_up(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("revoke");
    let (holder, _) = holding_forever(&h, &r).await;
    let revoker = h.lock(&r, h.ttl);
    let revocation = revoker.revoke(h.patience).await.unwrap();
    assert_eq!((revocation.asked, revocation.let_go), (1, true));
    let err = h.within("the holder was stopped", holder).await.unwrap();
    assert_eq!(err.lost_reason(), Some(LostReason::Revoked), "{err}");
    let notice = format!("{r}{REVOKE_SUFFIX}");
    assert!(
        h.store.holders(&notice).await.unwrap().is_empty(),
        "the notice is down"
    );
    assert!(
        revoker.try_acquire().await.unwrap(),
        "free after the revocation"
    );
    let again = h.lock(&r, h.ttl);
    let err = revoker.revoke(Duration::ZERO).await.unwrap_err();
    assert!(err.is_invalid_argument(), "{err}");
    let nobody = again.revoke(Duration::ZERO).await;
    assert!(
        nobody.is_ok_and(|r| r.asked == 1 && !r.let_go),
        "a holder that does not listen"
    );
    let _ = revoker.release().await.unwrap();
    Outcome::Ran
}

/// `QueueOne`: one waiter queues behind the holder, a second gives up at once; the queued one
/// gets the lock when it is released, and the slot is free again.
pub async fn queue_one_keeps_at_most_one_waiter(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("queue-one");
    let holder = h.lock(&r, h.ttl);
    assert!(holder.try_acquire().await.unwrap());
    let queued = h.lock(&r, h.ttl);
    let waiting = tokio::spawn({
        let queued = queued.clone();
        async move {
            queued
                .acquire_with_policy(Mode::Write, Wait::Forever, OnConflict::QueueOne)
                .await
        }
    });
    let slot = format!("{r}{QUEUE_SUFFIX}");
    h.within("the first queued", async {
        while h.store.holders(&slot).await.unwrap().is_empty() {
            h.sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Another run would wait forever: it gives up at once instead.
    let second = h.lock(&r, h.ttl);
    let policy = second.acquire_with_policy(Mode::Write, Wait::Forever, OnConflict::QueueOne);
    assert!(!h.within("the second gave up", policy).await.unwrap());
    assert!(!waiting.is_finished(), "the queued one waits");
    let _ = holder.release().await.unwrap();
    let got = h.within("the queued one got it", waiting).await.unwrap();
    assert!(got.unwrap(), "the queued one holds");
    // The slot is free again: a newcomer queues (its wait ends unanswered, having waited).
    let wait = Duration::from_millis(300);
    let third = h.lock(&r, h.ttl);
    let started = Instant::now();
    let policy = third.acquire_with_policy(Mode::Write, Wait::AtMost(wait), OnConflict::QueueOne);
    assert!(!policy.await.unwrap());
    assert!(
        started.elapsed() + SLACK >= wait,
        "it queued: {:?}",
        started.elapsed()
    );
    assert!(
        h.store.holders(&slot).await.unwrap().is_empty(),
        "the slot is free"
    );
    let _ = queued.release().await.unwrap();
    Outcome::Ran
}

/// `Replace`: the holder is revoked and the newcomer takes the lock, with its notice down so
/// that its own hold stands.
pub async fn replace_revokes_the_holder_and_takes_over(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("replace");
    let (old, ttl) = holding_forever(&h, &r).await;
    let new = h.lock(&r, ttl);
    let wait = Wait::AtMost(h.patience);
    assert!(
        new.acquire_with_policy(Mode::Write, wait, OnConflict::Replace)
            .await
            .unwrap()
    );
    let err = h.within("the old holder was stopped", old).await.unwrap();
    assert_eq!(err.lost_reason(), Some(LostReason::Revoked), "{err}");
    let notice = format!("{r}{REVOKE_SUFFIX}");
    assert!(
        h.store.holders(&notice).await.unwrap().is_empty(),
        "the notice is down"
    );
    let alive = new.keep_alive().unwrap();
    // Two looks for notices (every third of the ttl, at most 5 s; once a second elsewhere).
    let period = ttl.map_or(Duration::from_secs(1), |t| {
        (t / 3).min(Duration::from_secs(5))
    });
    tokio::select! {
        lost = alive.lost() => panic!("the new holder was revoked too: {lost}"),
        () = h.sleep(period * 2) => {}
    }
    assert_eq!(new.release().await.unwrap(), Release::Released);
    Outcome::Ran
}
