//! Scenarios for waiting, waking, cancellation, races and fencing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rand::Rng as _;

use super::{Harness, Outcome, require};
use crate::clock::ManualClock;
use crate::key::Mode;
use crate::lock::factory::LockFactory;
use crate::lock::lockable::Lockable as _;

/// Lets spawned waiters reach their wait: a real-time pause, never a correctness condition.
const SETTLE: Duration = Duration::from_millis(50);

/// A native write wait returns once the holder releases.
pub async fn native_wait_returns_after_release(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().blocking, "no native wait");
    let r = h.resource("native-wait");
    let (holder, waiter) = (h.key(&r), h.key(&r));
    assert!(h.store.save(&holder, h.ttl).await.unwrap().is_acquired());
    let store = h.store.clone();
    let w = waiter.clone();
    let wait = tokio::spawn(async move { store.wait_and_save(&w, h.ttl).await });
    tokio::time::sleep(SETTLE).await;
    assert!(
        !wait.is_finished(),
        "the waiter waits while the lock is held"
    );
    h.store.delete(&holder).await.unwrap();
    let saved = h
        .within("the native wait returns", wait)
        .await
        .unwrap()
        .unwrap();
    assert!(saved.is_acquired(), "{saved:?}");
    assert!(h.store.exists(&waiter).await.unwrap().is_held());
    h.store.delete(&waiter).await.unwrap();
    Outcome::Ran
}

/// A cancelled native wait holds nothing, even after the lock frees.
pub async fn cancelled_native_wait_holds_nothing(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().blocking, "no native wait");
    let r = h.resource("native-cancel");
    let (holder, waiter) = (h.key(&r), h.key(&r));
    assert!(h.store.save(&holder, h.ttl).await.unwrap().is_acquired());
    let timed_out = tokio::time::timeout(SETTLE, h.store.wait_and_save(&waiter, h.ttl)).await;
    assert!(
        timed_out.is_err(),
        "the wait did not finish while the lock was held"
    );
    h.store.delete(&holder).await.unwrap();
    tokio::time::sleep(SETTLE).await;
    assert!(
        !h.store.exists(&waiter).await.unwrap().is_held(),
        "the cancelled waiter holds nothing"
    );
    let third = h.key(&r);
    assert!(h.store.save(&third, h.ttl).await.unwrap().is_acquired());
    h.store.delete(&third).await.unwrap();
    Outcome::Ran
}

/// A native read wait returns once the writer releases.
pub async fn native_read_wait_returns_after_writer_release(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().blocking_shared, "no native read wait");
    let r = h.resource("native-read-wait");
    let (writer, reader) = (h.key(&r), h.key(&r));
    assert!(h.store.save(&writer, h.ttl).await.unwrap().is_acquired());
    let store = h.store.clone();
    let rd = reader.clone();
    let wait = tokio::spawn(async move { store.wait_and_save_read(&rd, h.ttl).await });
    tokio::time::sleep(SETTLE).await;
    assert!(!wait.is_finished(), "the reader waits for the writer");
    h.store.delete(&writer).await.unwrap();
    let saved = h
        .within("the native read wait returns", wait)
        .await
        .unwrap()
        .unwrap();
    assert!(saved.is_acquired(), "{saved:?}");
    h.store.delete(&reader).await.unwrap();
    Outcome::Ran
}

/// Readers do not wait for each other in a native read wait.
pub async fn readers_do_not_wait_for_each_other(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().blocking_shared, "no native read wait");
    let r = h.resource("readers-no-wait");
    let (a, b) = (h.key(&r), h.key(&r));
    assert!(h.store.save_read(&a, h.ttl).await.unwrap().is_acquired());
    let saved = h
        .within(
            "a second reader gets in",
            h.store.wait_and_save_read(&b, h.ttl),
        )
        .await
        .unwrap();
    assert!(saved.is_acquired(), "{saved:?}");
    h.store.delete(&a).await.unwrap();
    h.store.delete(&b).await.unwrap();
    Outcome::Ran
}

/// A blocking acquire waits while the lock is held and gets it once it is released.
pub async fn blocking_acquire_wakes_on_release(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("wake");
    let (holder, waiter) = (h.lock(&r, h.ttl), h.lock(&r, h.ttl));
    holder.acquire().await.unwrap();
    let wait = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire().await }
    });
    tokio::time::sleep(SETTLE).await;
    assert!(!wait.is_finished(), "the waiter waits");
    let _ = holder.release().await.unwrap();
    h.within("the waiter gets the lock", wait)
        .await
        .unwrap()
        .unwrap();
    assert!(waiter.is_acquired().await.unwrap());
    let _ = waiter.release().await.unwrap();
    Outcome::Ran
}

/// Waiters are woken by the release itself: with a clock that never moves, no poll or retry
/// sleep can ever end, so only the store's notification can wake them.
pub async fn waiters_wake_on_release_without_polling(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().notifies, "the store cannot observe releases");
    let frozen = ManualClock::frozen();
    let factory = LockFactory::from_arc(h.store.clone())
        .with_clock(Arc::new(frozen.clone()))
        .with_ttl(h.ttl);
    let r = h.resource("no-polling");
    let holder = factory.create_lock(r.as_str());
    holder.acquire().await.unwrap();
    let mut waits = Vec::new();
    for mode in [Mode::Write, Mode::Read, Mode::Write] {
        let waiter = factory.create_lock(r.as_str());
        waits.push(tokio::spawn(async move {
            match mode {
                Mode::Write => waiter.acquire().await?,
                Mode::Read => waiter.acquire_read().await?,
            }
            waiter.release().await
        }));
    }
    tokio::time::sleep(SETTLE).await;
    assert!(waits.iter().all(|w| !w.is_finished()), "the waiters wait");
    let _ = holder.release().await.unwrap();
    for wait in waits {
        let _ = h
            .within("a waiter is woken by the release", wait)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        frozen.elapsed(),
        Duration::ZERO,
        "no time passed on the lock clock"
    );
    Outcome::Ran
}

/// A blocking acquire dropped while waiting (a timeout) holds nothing and leaves the holder
/// alone; afterwards a third holder gets the lock.
pub async fn cancelled_wait_holds_nothing(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("cancel-wait");
    let (holder, waiter) = (h.lock(&r, h.ttl), h.lock(&r, h.ttl));
    holder.acquire().await.unwrap();
    assert!(
        tokio::time::timeout(SETTLE, waiter.acquire())
            .await
            .is_err()
    );
    if h.caps().shared {
        assert!(
            tokio::time::timeout(SETTLE, waiter.acquire_read())
                .await
                .is_err()
        );
    }
    assert!(
        !waiter.is_acquired().await.unwrap(),
        "the waiter holds nothing"
    );
    assert!(
        holder.is_acquired().await.unwrap(),
        "the holder is untouched"
    );
    let _ = holder.release().await.unwrap();
    let third = h.lock(&r, h.ttl);
    assert!(third.try_acquire().await.unwrap());
    assert!(!waiter.is_acquired().await.unwrap());
    let _ = third.release().await.unwrap();
    Outcome::Ran
}

/// A holder that held before the acquire began keeps what it had when that acquire is dropped:
/// a blocking promotion cancelled while another reader holds keeps the read lock.
pub async fn cancelled_reacquire_keeps_the_lock(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks to promote");
    let r = h.resource("cancel-promotion");
    let (a, b) = (h.lock(&r, h.ttl), h.lock(&r, h.ttl));
    assert!(a.try_acquire_read().await.unwrap());
    assert!(b.try_acquire_read().await.unwrap());
    assert!(tokio::time::timeout(SETTLE, a.acquire()).await.is_err());
    assert!(a.is_acquired().await.unwrap(), "the read lock is kept");
    assert_eq!(a.held_mode(), Some(Mode::Read));
    let w = h.lock(&r, h.ttl);
    assert!(
        !w.try_acquire().await.unwrap(),
        "and still excludes writers"
    );
    let _ = a.release().await.unwrap();
    let _ = b.release().await.unwrap();
    Outcome::Ran
}

/// Acquires dropped at random moments (free lock or held lock, write or read) leave nothing
/// behind: the waiter never holds afterwards unless its acquire completed, and a fresh holder
/// gets the lock at the end.
pub async fn cancellation_at_random_points_leaves_nothing(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("cancel-random");
    let holder = h.lock(&r, h.ttl);
    for i in 0..40 {
        let held = i % 2 == 0;
        if held {
            holder.acquire().await.unwrap();
        }
        let waiter = h.lock(&r, h.ttl);
        let budget = Duration::from_micros(rand::rng().random_range(0..3_000));
        let read = h.caps().shared && i % 4 >= 2;
        let done = if read {
            tokio::time::timeout(budget, waiter.acquire_read()).await
        } else {
            tokio::time::timeout(budget, waiter.acquire()).await
        };
        match done {
            Ok(result) => {
                result.unwrap();
                assert!(!held, "the waiter got a lock that was held");
                assert!(waiter.is_acquired().await.unwrap());
                let _ = waiter.release().await.unwrap();
            }
            Err(_) => {
                assert!(
                    !waiter.is_acquired().await.unwrap(),
                    "round {i}: cancelled waiter holds"
                );
                assert!(
                    !h.store.exists(waiter.key()).await.unwrap().is_held(),
                    "round {i}: stored"
                );
            }
        }
        if held {
            assert!(
                holder.is_acquired().await.unwrap(),
                "round {i}: holder disturbed"
            );
            let _ = holder.release().await.unwrap();
        }
    }
    let fresh = h.lock(&r, h.ttl);
    assert!(
        fresh.try_acquire().await.unwrap(),
        "nothing was left behind"
    );
    let _ = fresh.release().await.unwrap();
    Outcome::Ran
}

/// The timed forms give up with `false` and hold nothing.
pub async fn acquire_timeout_gives_up_and_holds_nothing(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("timeout");
    let (holder, waiter) = (h.lock(&r, h.ttl), h.lock(&r, h.ttl));
    holder.acquire().await.unwrap();
    let wait = Duration::from_millis(300);
    assert!(!waiter.acquire_timeout(wait).await.unwrap());
    assert!(!waiter.acquire_read_timeout(wait).await.unwrap());
    assert!(!waiter.is_acquired().await.unwrap());
    let _ = holder.release().await.unwrap();
    assert!(
        waiter.acquire_timeout(wait).await.unwrap(),
        "a free lock comes in time"
    );
    let _ = waiter.release().await.unwrap();
    Outcome::Ran
}

/// Many tasks incrementing a counter under the lock, with a yield between read and write, lose
/// no increment, and never two are inside at once.
pub async fn counter_race_under_the_lock(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("counter");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let (tasks, rounds) = (8, 20);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let lock = h.lock(&r, h.ttl);
        let (counter, inside) = (counter.clone(), inside.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..rounds {
                lock.acquire().await.unwrap();
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders inside"
                );
                let v = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                let _ = lock.release().await.unwrap();
            }
        }));
    }
    for handle in handles {
        h.within("the racing tasks finish", handle).await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), tasks * rounds);
    Outcome::Ran
}

/// A hundred waiters on one resource all get their turn, one at a time.
pub async fn many_waiters_all_get_their_turn(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("many");
    let inside = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..100 {
        let lock = h.lock(&r, h.ttl);
        let (inside, served) = (inside.clone(), served.clone());
        handles.push(tokio::spawn(async move {
            lock.acquire().await.unwrap();
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "two holders inside"
            );
            tokio::task::yield_now().await;
            inside.fetch_sub(1, Ordering::SeqCst);
            served.fetch_add(1, Ordering::SeqCst);
            let _ = lock.release().await.unwrap();
        }));
    }
    for handle in handles {
        h.within("every waiter is served", handle).await.unwrap();
    }
    assert_eq!(served.load(Ordering::SeqCst), 100);
    Outcome::Ran
}

/// Each exclusive acquisition gets a fencing token greater than every earlier one; a re-acquire
/// keeps it, a reader's is at least the last writer's and below the next one's, a promotion gets
/// a new one.
pub async fn fencing_tokens_strictly_increase(h: Harness) -> Outcome {
    require!(h.caps().fencing, "no fencing tokens");
    let r = h.resource("fencing");
    let a = h.lock(&r, h.ttl);
    assert_eq!(a.fencing_token(), None, "no token before acquiring");
    assert!(a.try_acquire().await.unwrap());
    let t1 = a.fencing_token().expect("a token");
    assert!(a.try_acquire().await.unwrap());
    assert_eq!(a.fencing_token(), Some(t1), "a re-acquire keeps the token");
    let _ = a.release().await.unwrap();
    assert_eq!(a.fencing_token(), None, "no token after release");

    let b = h.lock(&r, h.ttl);
    assert!(b.try_acquire().await.unwrap());
    let t2 = b.fencing_token().expect("a token");
    assert!(t2 > t1, "{t2} > {t1}");
    if h.caps().shared {
        assert!(b.try_acquire_read().await.unwrap());
        let read = b.fencing_token().expect("a reader's token");
        assert!(
            read >= t2,
            "a reader's token {read} >= the last writer's {t2}"
        );
        assert!(b.try_acquire().await.unwrap());
        let t3 = b.fencing_token().expect("a token");
        assert!(
            t3 > read,
            "a promotion is a new exclusive acquisition: {t3} > {read}"
        );
    }
    let _ = b.release().await.unwrap();

    // Concurrent holders, recorded in the order they held the lock.
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for _ in 0..8 {
        let lock = h.lock(&r, h.ttl);
        let order = order.clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..5 {
                lock.acquire().await.unwrap();
                order.lock().unwrap().push(lock.fencing_token().unwrap());
                let _ = lock.release().await.unwrap();
            }
        }));
    }
    for handle in handles {
        h.within("fenced holders finish", handle).await.unwrap();
    }
    let order = order.lock().unwrap();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    Outcome::Ran
}
