//! Semaphore scenarios every counting store here runs (beside the conformance suite): the
//! count and the weights, the limit rule, a dead holder's permits, a checker under contention.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rand::Rng as _;
use xtr_lock::{ErrorKind, Lock, LockFactory, Lockable as _, Release, Semaphore, Store as _};

/// A name no other test (or earlier run) uses.
pub(crate) fn unique(name: &str) -> String {
    format!("sem:{name}:{:08x}", rand::rng().random::<u32>())
}

pub(crate) fn sem(f: &LockFactory, name: &str, limit: u32, count: u32) -> Semaphore {
    f.create_semaphore(name, limit)
        .unwrap()
        .permits(count)
        .unwrap()
}

/// Limit 3: three single permits in, a fourth refused; a release frees one; a holder of two
/// waits for two; a lock of the same name is unrelated (`layout` looks at the store while it
/// and three permits are held).
pub(crate) async fn counts(f: &LockFactory, r: &str, layout: impl AsyncFnOnce(&Lock)) {
    let (a, b, c, d) = (
        sem(f, r, 3, 1),
        sem(f, r, 3, 1),
        sem(f, r, 3, 1),
        sem(f, r, 3, 1),
    );
    for s in [&a, &b, &c] {
        assert!(s.try_acquire().await.unwrap());
    }
    assert!(
        !d.try_acquire().await.unwrap(),
        "the fourth permit is refused"
    );
    let usage = d.usage().await.unwrap();
    assert_eq!(
        (usage.used, usage.limit, usage.holders.len()),
        (3, Some(3), 3)
    );
    assert_eq!(d.remaining().await.unwrap(), 0);
    // A lock of the same name is another thing.
    let lock = f.create_lock(r);
    assert!(
        lock.try_acquire().await.unwrap(),
        "a lock beside the semaphore"
    );
    layout(&lock).await;
    assert_eq!(lock.release().await.unwrap(), Release::Released);

    // Weights: a holder of two does not fit beside two singles, and fits once one goes.
    assert_eq!(a.release().await.unwrap(), Release::Released);
    let two = sem(f, r, 3, 2);
    assert!(!two.try_acquire().await.unwrap(), "two permits, one free");
    assert!(d.try_acquire().await.unwrap(), "the one free permit");
    assert_eq!(b.release().await.unwrap(), Release::Released);
    assert_eq!(c.release().await.unwrap(), Release::Released);
    assert!(two.try_acquire().await.unwrap(), "two free now");
    let held = two.holders().await.unwrap();
    let mut counts: Vec<u32> = held.iter().filter_map(|h| h.permits).collect();
    counts.sort_unstable();
    assert_eq!(counts, [1, 2]);
    // A re-acquire by a holder refreshes: no second row, the count unchanged.
    assert!(two.try_acquire().await.unwrap());
    assert_eq!(two.usage().await.unwrap().used, 3);
    assert!(two.is_acquired().await.unwrap());
    two.refresh(None).await.unwrap();
    if f.store().capabilities().fencing {
        // Fencing: each acquisition a larger token.
        let (t1, t2) = (d.fencing_token().unwrap(), two.fencing_token().unwrap());
        assert!(t2 > t1, "{t1} then {t2}");
    }
    assert_eq!(two.release().await.unwrap(), Release::Released);
    assert_eq!(two.release().await.unwrap(), Release::NotHeld);
    assert_eq!(d.release().await.unwrap(), Release::Released);
    let usage = d.usage().await.unwrap();
    assert_eq!((usage.used, usage.limit), (0, None), "nobody holds");
}

/// The stored limit binds while anybody holds, naming both; once nobody holds, the next
/// holder's is the semaphore's.
pub(crate) async fn limit_rule(f: &LockFactory, r: &str) {
    let three = sem(f, r, 3, 1);
    let five = sem(f, r, 5, 1);
    assert!(three.try_acquire().await.unwrap());
    let err = five.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let said = err.to_string();
    assert!(
        said.contains("limit of 3") && said.contains("limit of 5"),
        "{said}"
    );
    assert_eq!(three.release().await.unwrap(), Release::Released);
    assert!(five.try_acquire().await.unwrap(), "nobody holds: 5 now");
    assert_eq!(five.usage().await.unwrap().limit, Some(5));
    assert!(three.try_acquire().await.is_err(), "now 3 is the stranger");
    assert_eq!(five.release().await.unwrap(), Release::Released);
}

/// A holder that dies (dropped without a release: its row is stored data) keeps its permits
/// until its ttl, then a waiter gets them.
pub(crate) async fn a_dead_holders_permits_come_back(f: &LockFactory, r: &str) {
    let short = Duration::from_secs(2);
    let dead = sem(f, r, 2, 2).with_ttl(short).with_keep_alive(false);
    assert!(dead.try_acquire().await.unwrap());
    drop(dead);
    let waiter = sem(f, r, 2, 1);
    assert!(
        !waiter.try_acquire().await.unwrap(),
        "still held until its ttl"
    );
    assert!(
        waiter
            .acquire_timeout(Duration::from_secs(10))
            .await
            .unwrap(),
        "the dead holder's permits come back at its ttl"
    );
    let usage = waiter.usage().await.unwrap();
    assert_eq!((usage.used, usage.holders.len()), (1, 1));
    assert_eq!(waiter.release().await.unwrap(), Release::Released);
}

/// 8 contenders, each taking 1 to 3 permits of 4 again and again, waiting for them: the
/// permits held at once, counted on our side, never exceed the limit.
pub(crate) async fn checker(f: &LockFactory, r: &str) {
    let held = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let count = rand::rng().random_range(1..=3);
        let s = sem(f, r, 4, count);
        let (held, most) = (held.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                assert!(s.acquire_timeout(Duration::from_secs(60)).await.unwrap());
                let now = held.fetch_add(count, Ordering::SeqCst) + count;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= 4, "{now} permits held at once");
                let seen = s.usage().await.unwrap().used;
                assert!(seen <= 4 && seen >= count, "the store counts {seen}");
                tokio::task::yield_now().await;
                held.fetch_sub(count, Ordering::SeqCst);
                assert_eq!(s.release().await.unwrap(), Release::Released);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=4).contains(&most), "{most}");
    assert_eq!(sem(f, r, 4, 1).usage().await.unwrap().used, 0);
}
