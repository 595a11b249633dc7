//! Counting semaphores on the etcd store, on a server the testkit starts: limits and weights,
//! keys apart from the lock of the same name (and from `etcdctl lock`), FIFO fairness for a
//! big waiter, a dead holder's permits back at its lease's end, the limit rule, and waits
//! dropped anywhere leaving no key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::{
    ErrorKind, EtcdStore, Key, LockFactory, Lockable as _, Permits, Release, Semaphore, Store as _,
};
use xtr_lock_testkit::etcd::EtcdCluster;

use super::etcd::{keys, resource, store, until};

const PATIENCE: Duration = Duration::from_secs(20);

fn semaphores(store: &Arc<EtcdStore>, r: &str, limit: u32, n: usize) -> Vec<Semaphore> {
    let factory = LockFactory::from_arc(store.clone());
    (0..n)
        .map(|_| factory.create_semaphore(r, limit).unwrap())
        .collect()
}

/// The values under the semaphore's directory, in key order.
fn values(cluster: &EtcdCluster, dir: &str) -> Vec<String> {
    cluster
        .etcdctl_output(&["get", "--prefix", "--print-value-only", dir])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_weights_count_and_stay_apart_from_the_lock_of_the_same_name() {
    let cluster = EtcdCluster::single();
    let store = store(&cluster, "");
    let r = resource("sem-limits");
    let dir = store.semaphore_directory(&r);
    assert_eq!(dir, format!("xtr-semaphore/{r}/"));
    let singles = semaphores(&store, &r, 3, 4);
    for s in &singles[..3] {
        assert!(s.try_acquire().await.unwrap());
    }
    assert!(
        !singles[3].try_acquire().await.unwrap(),
        "three of three held"
    );
    let usage = singles[3].usage().await.unwrap();
    assert_eq!((usage.used, usage.limit), (3, Some(3)));
    assert_eq!(usage.holders.len(), 3);
    assert!(usage.holders.iter().all(|h| h.permits == Some(1)));
    assert_eq!(values(&cluster, &dir), ["limit=3 permits=1"; 3]);
    let tokens: Vec<u64> = singles[..3]
        .iter()
        .map(|s| s.fencing_token().unwrap())
        .collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");

    // The lock of the same name and etcdctl's see none of it.
    let factory = LockFactory::from_arc(store.clone());
    let lock = factory.create_lock(&r);
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    let etcdctl = cluster
        .etcdctl()
        .args(["lock", &r, "--", "true"])
        .output()
        .unwrap();
    assert!(etcdctl.status.success(), "etcdctl lock is not blocked");
    assert!(store.holders(&r).await.unwrap().is_empty());

    // Weights: a holder of 2 waits for two permits.
    let _ = singles[0].release().await.unwrap();
    assert_eq!(singles[3].remaining().await.unwrap(), 1);
    let double = singles[3].clone().permits(2).unwrap();
    assert!(
        !double.try_acquire().await.unwrap(),
        "one permit free, two asked"
    );
    let _ = singles[1].release().await.unwrap();
    assert!(double.try_acquire().await.unwrap());
    let usage = double.usage().await.unwrap();
    assert_eq!(usage.used, 3);
    let mut counts: Vec<u32> = usage.holders.iter().filter_map(|h| h.permits).collect();
    counts.sort_unstable();
    assert_eq!(counts, [1, 2]);
    assert!(!singles[0].try_acquire().await.unwrap());
    let _ = double.release().await.unwrap();
    let _ = singles[2].release().await.unwrap();
    until("every key gone", || keys(&cluster, &dir).is_empty()).await;
    assert_eq!(singles[0].usage().await.unwrap().limit, None);
}

/// Limit 3, two single permits held: a waiter for 3 queues, then single newcomers. A free
/// permit is not given to the newcomers: the big waiter is served first, then them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_waiter_is_served_before_later_single_newcomers() {
    let cluster = EtcdCluster::single();
    let store = store(&cluster, "");
    let r = resource("sem-fifo");
    let dir = store.semaphore_directory(&r);
    let held = semaphores(&store, &r, 3, 2);
    for s in &held {
        assert!(s.try_acquire().await.unwrap());
    }
    let big = semaphores(&store, &r, 3, 1).remove(0).permits(3).unwrap();
    let big_wait = tokio::spawn({
        let big = big.clone();
        async move { big.acquire().await }
    });
    until("the big waiter queues", || keys(&cluster, &dir).len() == 3).await;
    let late = semaphores(&store, &r, 3, 2);
    let late_waits: Vec<_> = late
        .iter()
        .map(|s| {
            let s = s.clone();
            tokio::spawn(async move { s.acquire().await })
        })
        .collect();
    until("the newcomers queue", || keys(&cluster, &dir).len() == 5).await;
    // One permit is free, but a try does not jump the queue either.
    assert_eq!(held[0].usage().await.unwrap().used, 2);
    let extra = semaphores(&store, &r, 3, 1).remove(0);
    assert!(
        !extra.try_acquire().await.unwrap(),
        "FIFO: the big waiter first"
    );
    assert!(late_waits.iter().all(|w| !w.is_finished()));

    let _ = held[0].release().await.unwrap();
    let _ = held[1].release().await.unwrap();
    tokio::time::timeout(PATIENCE, big_wait)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let usage = big.usage().await.unwrap();
    assert_eq!((usage.used, usage.holders.len()), (3, 1), "{usage:?}");
    assert!(late_waits.iter().all(|w| !w.is_finished()));
    let big_token = big.fencing_token().unwrap();
    let _ = big.release().await.unwrap();
    for w in late_waits {
        tokio::time::timeout(PATIENCE, w)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert_eq!(big.usage().await.unwrap().used, 2);
    // Tokens increase in the order permits were granted.
    assert!(late.iter().all(|s| s.fencing_token().unwrap() > big_token));
    for s in &late {
        let _ = s.release().await.unwrap();
    }
    until("every key gone", || keys(&cluster, &dir).is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_limit_is_refused_while_anybody_holds_and_taken_once_nobody_does() {
    let cluster = EtcdCluster::single();
    let store = store(&cluster, "");
    let r = resource("sem-limit");
    let dir = store.semaphore_directory(&r);
    let three = semaphores(&store, &r, 3, 1).remove(0);
    assert!(three.try_acquire().await.unwrap());
    let four = semaphores(&store, &r, 4, 1).remove(0);
    for wait in [false, true] {
        let err = if wait {
            four.acquire().await.unwrap_err()
        } else {
            four.try_acquire().await.unwrap_err()
        };
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("limit of 3") && text.contains("limit of 4"),
            "{text}"
        );
        assert_eq!(
            keys(&cluster, &dir).len(),
            1,
            "the refused holder left no key"
        );
    }
    assert_eq!(four.usage().await.unwrap().limit, Some(3));
    let _ = three.release().await.unwrap();
    assert!(
        four.try_acquire().await.unwrap(),
        "nobody holds: the limit is 4 now"
    );
    assert_eq!(four.usage().await.unwrap().limit, Some(4));
    assert!(three.try_acquire().await.is_err());
    let _ = four.release().await.unwrap();
}

/// A holder that dies without a word (its runtime torn down: no release, no revoke, as a
/// killed process) keeps its permits until its lease ends, and not longer: a waiter gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_permits_come_back_at_its_leases_end() {
    let cluster = EtcdCluster::single();
    let r = resource("sem-dead");
    let ttl = Duration::from_secs(2);
    let dsn = cluster.dsn("");
    let (r2, dsn2) = (r.clone(), dsn.clone());
    let died = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let factory = LockFactory::new(EtcdStore::from_dsn(&dsn2).unwrap()).with_ttl(ttl);
            let s = factory
                .create_semaphore(&r2, 2)
                .unwrap()
                .permits(2)
                .unwrap();
            s.acquire().await.unwrap();
            std::mem::forget(s);
        });
        drop(rt);
        Instant::now()
    })
    .join()
    .unwrap();
    let store = store(&cluster, "");
    let waiter = semaphores(&store, &r, 2, 1).remove(0);
    assert!(
        !waiter.try_acquire().await.unwrap(),
        "the dead holder's lease lives"
    );
    tokio::time::timeout(PATIENCE, waiter.acquire())
        .await
        .unwrap()
        .unwrap();
    let after = died.elapsed();
    assert!(
        after >= ttl / 2,
        "the permits came back {after:?} after the death"
    );
    let _ = waiter.release().await.unwrap();
}

/// Saves and waits of semaphore keys dropped at every point of their way leave no key of
/// theirs behind and never a hold; the full holder is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saves_and_waits_dropped_anywhere_leave_no_key() {
    let cluster = EtcdCluster::single();
    let store = store(&cluster, "");
    let r = resource("sem-dropped");
    let dir = store.semaphore_directory(&r);
    let permits = |count| Permits::new(2, count).unwrap();
    let holder = Key::for_semaphore(&r, permits(1));
    assert!(store.save(&holder, None).await.unwrap().is_acquired());
    for round in 0..60u64 {
        // Two permits asked, one free: it queues and waits (or is refused).
        let key = Key::for_semaphore(&r, permits(2));
        let after = Duration::from_micros(round * 50);
        let _ = tokio::time::timeout(after, async {
            if round % 2 == 0 {
                store.wait_and_save(&key, None).await
            } else {
                store.save(&key, None).await
            }
        })
        .await;
        assert!(!store.exists(&key).await.unwrap().is_held());
        until("only the holder's key is left", || {
            keys(&cluster, &dir).len() == 1
        })
        .await;
    }
    assert!(store.exists(&holder).await.unwrap().is_held());
    assert!(store.delete(&holder).await.unwrap());
    for round in 0..40u64 {
        let key = Key::for_semaphore(&r, permits(1));
        let _ =
            tokio::time::timeout(Duration::from_micros(round * 100), store.save(&key, None)).await;
        let _ = store.delete(&key).await;
        until("nothing is left", || keys(&cluster, &dir).is_empty()).await;
    }
    // Through the front end: a sibling's wait dropped leaves its holder's grant alone.
    let s = semaphores(&store, &r, 1, 1).remove(0);
    let other = semaphores(&store, &r, 1, 1).remove(0);
    assert!(other.try_acquire().await.unwrap());
    assert!(!s.acquire_timeout(Duration::from_millis(300)).await.unwrap());
    assert_eq!(keys(&cluster, &dir).len(), 1);
    let _ = other.release().await.unwrap();
    assert!(s.try_acquire().await.unwrap());
    let sibling = s.clone();
    assert!(
        sibling
            .acquire_timeout(Duration::from_millis(50))
            .await
            .unwrap()
    );
    assert!(
        s.is_acquired().await.unwrap(),
        "the sibling's wait kept the grant"
    );
    assert_eq!(s.release().await.unwrap(), Release::Released);
    until("nothing is left", || keys(&cluster, &dir).is_empty()).await;
}
