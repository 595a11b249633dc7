//! Scenarios for counting semaphores, on every store that counts; a store that cannot must
//! refuse a semaphore as unsupported, saying why.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rand::Rng as _;

use super::{Harness, Outcome, require};
use crate::error::ErrorKind;
use crate::key::Key;
use crate::lock::lockable::{Lockable as _, Release};
use crate::semaphore::Semaphore;

/// Lets spawned waiters reach their wait: a real-time pause, never a correctness condition.
const SETTLE: Duration = Duration::from_millis(50);

fn semaphore(h: &Harness, resource: &str, limit: u32, count: u32) -> Semaphore {
    let s = h
        .factory()
        .create_semaphore(resource, limit)
        .expect("a valid limit");
    if count == 1 {
        s
    } else {
        s.permits(count).expect("a valid count")
    }
}

fn counting(h: &Harness) -> bool {
    h.caps().counting && h.caps().excludes
}

/// A store that cannot count refuses a semaphore as unsupported, saying why, and stores
/// nothing; one that can admits `limit` holders and refuses the next.
pub async fn semaphore_admits_up_to_its_limit(h: Harness) -> Outcome {
    let r = h.resource("sem-limit");
    if !h.caps().counting {
        let err = semaphore(&h, &r, 2, 1).try_acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("semaphores"), "{err}");
        return Outcome::Ran;
    }
    require!(counting(&h), "the store locks nothing");
    let holders: Vec<Semaphore> = (0..3).map(|_| semaphore(&h, &r, 3, 1)).collect();
    for s in &holders {
        assert!(s.try_acquire().await.unwrap(), "a permit is free");
    }
    let late = semaphore(&h, &r, 3, 1);
    assert!(!late.try_acquire().await.unwrap(), "three of three held");
    let usage = late.usage().await.unwrap();
    assert_eq!(usage.used, 3, "{usage:?}");
    assert_eq!(late.remaining().await.unwrap(), 0);
    assert!(usage.holders.len() <= 3, "{usage:?}");
    assert_eq!(holders[1].release().await.unwrap(), Release::Released);
    assert_eq!(late.remaining().await.unwrap(), 1);
    assert!(late.try_acquire().await.unwrap(), "a freed permit is taken");
    for s in holders.iter().chain([&late]) {
        let _ = s.release().await.unwrap();
    }
    assert_eq!(late.remaining().await.unwrap(), 3, "every permit came back");
    Outcome::Ran
}

/// A holder of several permits takes them all at once and gives them back together.
pub async fn semaphore_weights_count(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    let r = h.resource("sem-weights");
    let (big, two, one) = (
        semaphore(&h, &r, 4, 3),
        semaphore(&h, &r, 4, 2),
        semaphore(&h, &r, 4, 1),
    );
    assert!(big.try_acquire().await.unwrap());
    assert!(!two.try_acquire().await.unwrap(), "3 + 2 > 4");
    assert!(one.try_acquire().await.unwrap(), "3 + 1 = 4");
    assert_eq!(one.usage().await.unwrap().used, 4);
    assert_eq!(big.release().await.unwrap(), Release::Released);
    assert!(two.try_acquire().await.unwrap(), "1 + 2 <= 4");
    for s in [&two, &one] {
        assert_eq!(s.release().await.unwrap(), Release::Released);
    }
    Outcome::Ran
}

/// Acquiring again takes nothing more; one release gives everything back; a second release
/// finds nothing.
pub async fn semaphore_reacquire_takes_nothing_more(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    let r = h.resource("sem-reacquire");
    let s = semaphore(&h, &r, 3, 2);
    assert!(s.try_acquire().await.unwrap());
    assert!(s.try_acquire().await.unwrap(), "the holder already holds");
    assert!(s.is_acquired().await.unwrap());
    assert_eq!(s.usage().await.unwrap().used, 2);
    assert_eq!(s.release().await.unwrap(), Release::Released);
    assert_eq!(s.release().await.unwrap(), Release::NotHeld);
    assert!(!s.is_acquired().await.unwrap());
    Outcome::Ran
}

/// A holder asking for another limit than the current holders use is refused, naming both;
/// once nobody holds, the new limit is the semaphore's.
pub async fn semaphore_limit_mismatch_is_refused(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    let r = h.resource("sem-mismatch");
    let (three, four) = (semaphore(&h, &r, 3, 1), semaphore(&h, &r, 4, 1));
    assert!(three.try_acquire().await.unwrap());
    let keeps_limit = three.usage().await.unwrap().limit.is_some();
    match four.try_acquire().await {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            let text = e.to_string();
            assert!(text.contains('3') && text.contains('4'), "{text}");
            assert!(!four.is_acquired().await.unwrap(), "nothing was stored");
        }
        // Only a store whose layout has no place for the limit (its usage says none) may
        // admit: it cannot check.
        Ok(took) => {
            assert!(
                !keeps_limit,
                "the store keeps limit 3, yet admitted a limit of 4"
            );
            assert!(took, "a store that does not check limits admits");
            let _ = four.release().await.unwrap();
        }
    }
    assert_eq!(three.release().await.unwrap(), Release::Released);
    assert!(
        four.try_acquire().await.unwrap(),
        "nobody holds: 4 is the limit now"
    );
    let _ = four.release().await.unwrap();
    Outcome::Ran
}

/// A semaphore and a lock of one name do not exclude each other.
pub async fn semaphore_and_lock_of_one_name_are_apart(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    let r = h.resource("sem-apart");
    let lock = h.lock(&r, h.ttl);
    assert!(lock.try_acquire().await.unwrap());
    let s = semaphore(&h, &r, 1, 1);
    assert!(s.try_acquire().await.unwrap(), "the lock is not a permit");
    let other = h.lock(&r, h.ttl);
    assert!(
        !other.try_acquire().await.unwrap(),
        "the lock still excludes"
    );
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert!(
        s.is_acquired().await.unwrap(),
        "the lock's release freed no permit"
    );
    assert!(!semaphore(&h, &r, 1, 1).try_acquire().await.unwrap());
    assert_eq!(s.release().await.unwrap(), Release::Released);
    Outcome::Ran
}

/// A waiter gets its permit once one frees, and a cancelled waiter holds nothing.
pub async fn semaphore_waiter_gets_a_freed_permit(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    let r = h.resource("sem-wait");
    let (holder, waiter, dropped) = (
        semaphore(&h, &r, 2, 2),
        semaphore(&h, &r, 2, 1),
        semaphore(&h, &r, 2, 1),
    );
    assert!(holder.try_acquire().await.unwrap());
    assert!(
        tokio::time::timeout(SETTLE, dropped.acquire())
            .await
            .is_err(),
        "no permit is free"
    );
    let w = waiter.clone();
    let patience = h.patience;
    let wait = tokio::spawn(async move { w.acquire_timeout(patience).await });
    tokio::time::sleep(SETTLE).await;
    assert!(!wait.is_finished(), "the waiter waits");
    assert_eq!(holder.release().await.unwrap(), Release::Released);
    assert!(
        h.within("the waiter's acquire", wait)
            .await
            .unwrap()
            .unwrap()
    );
    crate::settle(h.patience).await;
    assert!(
        !dropped.is_acquired().await.unwrap(),
        "the cancelled wait holds nothing"
    );
    assert_eq!(waiter.usage().await.unwrap().used, 1);
    let _ = waiter.release().await.unwrap();
    Outcome::Ran
}

/// Eight contenders taking random numbers of permits in a loop are never more than the limit
/// inside at once, and all of them get in.
pub async fn semaphore_never_exceeds_its_limit_under_contention(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    const LIMIT: u32 = 3;
    let r = h.resource("sem-checker");
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let counts: Vec<u32> = (0..8)
        .map(|_| rand::rng().random_range(1..=LIMIT))
        .collect();
    eprintln!("semaphore checker on {r}: permits per contender {counts:?}, limit {LIMIT}");
    let mut tasks = Vec::new();
    for count in counts {
        let s = semaphore(&h, &r, LIMIT, count);
        let (inside, peak, patience) = (inside.clone(), peak.clone(), h.patience * 3);
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                assert!(s.acquire_timeout(patience).await.unwrap(), "a turn came");
                let now = inside.fetch_add(count, Ordering::SeqCst) + count;
                peak.fetch_max(now, Ordering::SeqCst);
                assert!(now <= LIMIT, "{now} permits held at once, limit {LIMIT}");
                let pause = rand::rng().random_range(1..8);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                inside.fetch_sub(count, Ordering::SeqCst);
                assert_eq!(s.release().await.unwrap(), Release::Released);
            }
        }));
    }
    for t in tasks {
        // Each round may wait its whole acquire timeout; the join waits longer than that.
        match tokio::time::timeout(h.patience * 4, t).await {
            Ok(joined) => joined.unwrap(),
            Err(_) => panic!(
                "a contender's rounds did not end within {:?}",
                h.patience * 4
            ),
        }
    }
    assert!(peak.load(Ordering::SeqCst) <= LIMIT);
    assert_eq!(
        semaphore(&h, &r, LIMIT, 1).usage().await.unwrap().used,
        0,
        "every permit came back"
    );
    Outcome::Ran
}

/// Permits whose ttl ran out come back; their holder's release says they were lost.
pub async fn semaphore_expired_permits_come_back(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    require!(h.caps().expiring, "permits do not expire");
    let r = h.resource("sem-expiry");
    let ttl = h.time(Duration::from_millis(300));
    let old = semaphore(&h, &r, 1, 1).with_ttl(ttl);
    assert!(old.try_acquire().await.unwrap());
    let next = semaphore(&h, &r, 1, 1);
    let refused = !next.try_acquire().await.unwrap();
    assert!(refused || old.is_expired(), "one permit, held");
    assert!(
        next.acquire_timeout(h.patience).await.unwrap(),
        "the expired permit is free"
    );
    let refreshed = old.refresh(None).await.unwrap_err();
    assert_eq!(refreshed.kind(), ErrorKind::Lost, "{refreshed}");
    assert_eq!(
        next.usage().await.unwrap().used,
        1,
        "the refresh revived nothing"
    );
    assert_eq!(old.release().await.unwrap(), Release::Lost);
    assert!(
        next.is_acquired().await.unwrap(),
        "the old release took nothing"
    );
    let _ = next.release().await.unwrap();
    // Expired permits count for nothing, even before anyone saves again, and the limit goes
    // with the last holder.
    let gone = semaphore(&h, &r, 2, 2).with_ttl(ttl);
    assert!(gone.try_acquire().await.unwrap());
    h.within("the expired permits stop counting", async {
        while gone.usage().await.unwrap().used > 0 {
            h.sleep(h.time(Duration::from_millis(50))).await;
        }
    })
    .await;
    let other_limit = semaphore(&h, &r, 5, 1);
    assert!(
        other_limit.try_acquire().await.unwrap(),
        "nobody holds: any limit"
    );
    let _ = other_limit.release().await.unwrap();
    Outcome::Ran
}

/// A key with permits travels: read back in "another process" it is the same holder, with
/// its permits, and it can release; the original then finds its permits lost.
pub async fn semaphore_keys_travel(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    require!(h.caps().serializable_keys, "keys do not travel");
    let r = h.resource("sem-travel");
    let s = semaphore(&h, &r, 3, 2);
    assert!(s.try_acquire().await.unwrap());
    let json = s.key().to_json().unwrap();
    let copy = Key::from_json_with_clock(&json, h.clock.clone()).unwrap();
    assert_eq!(copy.permits(), s.key().permits());
    let there = h.factory().create_semaphore_from_key(copy).unwrap();
    assert!(there.is_acquired().await.unwrap(), "the same holder");
    assert_eq!(there.count(), 2);
    assert_eq!(there.release().await.unwrap(), Release::Released);
    assert_eq!(
        s.release().await.unwrap(),
        Release::Lost,
        "gone behind its back"
    );
    assert_eq!(there.usage().await.unwrap().used, 0);
    Outcome::Ran
}

/// The scoped and guard forms give the permits back on every path.
pub async fn semaphore_scopes_and_guards_give_permits_back(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    let r = h.resource("sem-scope");
    let s = semaphore(&h, &r, 2, 1);
    let n = s
        .scoped(async {
            let used = semaphore(&h, &r, 2, 1).usage().await?.used;
            Ok::<_, crate::Error>(used)
        })
        .await
        .unwrap();
    assert_eq!(n, 1, "the body ran holding one permit");
    let failed: Result<(), crate::Error> = s
        .scoped(async { Err(crate::Error::invalid_argument("the body failed")) })
        .await;
    assert!(failed.is_err());
    let guard = s.lock().await.unwrap();
    assert_eq!(s.usage().await.unwrap().used, 1);
    assert_eq!(guard.unlock().await.unwrap(), Release::Released);
    assert_eq!(s.usage().await.unwrap().used, 0, "nothing left held");
    Outcome::Ran
}

/// Permits removed behind their holder's back (a travelled copy of its key gives them back)
/// are reported: at once to a guard on a store that observes loss, else by the next refresh.
pub async fn semaphore_loss_is_reported(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    require!(h.caps().serializable_keys, "keys do not travel");
    let r = h.resource("sem-loss");
    let s = semaphore(&h, &r, 2, 1);
    let guard = s.lock().await.unwrap();
    let holder = guard.lock().key().clone();
    let copy = Key::from_json_with_clock(&holder.to_json().unwrap(), h.clock.clone()).unwrap();
    assert!(
        h.store.delete(&copy).await.unwrap(),
        "the copy gives the permit back"
    );
    if h.caps().observes_loss {
        let lost = h.within("the guard hears of the loss", guard.lost()).await;
        assert!(lost.to_string().contains(&r), "{lost}");
    } else {
        let refreshed = guard.lock().refresh(None).await.unwrap_err();
        assert_eq!(refreshed.kind(), ErrorKind::Lost, "{refreshed}");
    }
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);
    Outcome::Ran
}

/// Tasks sharing one `Semaphore` each take their own permits through `run`, `scoped` and
/// `lock`: never more than the limit inside.
pub async fn a_shared_semaphore_admits_its_limit_per_task(h: Harness) -> Outcome {
    require!(counting(&h), "the store has no counting semaphores");
    let r = h.resource("sem-shared");
    let shared = semaphore(&h, &r, 2, 1);
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (s, inside, peak) = (shared.clone(), inside.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            let body = async move {
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, crate::Error>(())
            };
            match i % 3 {
                0 => s.run(crate::RunOptions::new(), || body).await,
                1 => s.scoped(body).await,
                _ => {
                    let guard = s.lock().await?;
                    body.await?;
                    guard.unlock().await.map(|_| ())
                }
            }
        }));
    }
    for t in tasks {
        h.within("a task's turn", t).await.unwrap().unwrap();
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 2, "{peak} tasks inside with limit 2");
    assert_eq!(
        shared.usage().await.unwrap().used,
        0,
        "every permit came back"
    );
    Outcome::Ran
}
