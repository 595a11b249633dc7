//! Locks on a master found through Sentinel when it dies: with `wait_replicas=1` the holder
//! keeps its lock on the promoted replica (its renewals go on, a second holder is still shut
//! out); without it, a holder whose lock never reached the replica is told at once, on the
//! sentinels' `+switch-master`, that it lost it.

use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, LostReason, RedisStore, Release};
use xtr_lock_testkit::redis_sentinel::RedisSentinelGroup;

use crate::redis_cluster_faults::{cut_off, fail_over_under_contention};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_promoted_replica_never_had_is_reported_lost_on_the_switch() {
    let began = Instant::now();
    let group = RedisSentinelGroup::start("lossy");
    let store = RedisStore::from_dsn(&group.dsn()).unwrap();
    let (master, replica) = (group.master_port(), group.replica_ports()[0]);
    let mut group = tokio::task::spawn_blocking(move || {
        cut_off(|p, a| group.cli(p, a), master, replica);
        group
    })
    .await
    .unwrap();
    // A lease far longer than the test: only the switch can tell the holder.
    let ttl = Duration::from_secs(60);
    let holder = LockFactory::new(store.clone())
        .create_lock("unreplicated")
        .with_ttl(Some(ttl));
    holder.acquire().await.unwrap();
    let watch = holder.keep_alive().unwrap();
    assert_eq!(
        group.cli(replica, &["DBSIZE"]),
        "0",
        "the replica has nothing"
    );
    let killed = Instant::now();
    let (group, new) = tokio::task::spawn_blocking(move || {
        let new = group.kill_master();
        (group, new)
    })
    .await
    .unwrap();
    assert_eq!(new, replica);
    let switched = killed.elapsed();
    let lost = tokio::time::timeout(Duration::from_secs(10), watch.lost())
        .await
        .expect("the loss is told soon after the switch, long before a renewal");
    let told = killed.elapsed();
    eprintln!(
        "master {master} killed; sentinels agreed on {new} after {switched:?}; loss ({}) told \
         after {told:?}; test took {:?}",
        lost.reason,
        began.elapsed()
    );
    assert_ne!(lost.reason, LostReason::Expired);
    assert_eq!(holder.release().await.unwrap(), Release::Lost);
    let next = LockFactory::new(store)
        .create_lock("unreplicated")
        .with_ttl(Some(ttl));
    assert!(
        next.try_acquire().await.unwrap(),
        "the new master takes locks"
    );
    drop(group);
}

/// Renews `holder` until a renewal succeeds, returning the number of tries. Right after the
/// old master came back as the new one's replica, its first acknowledgement can miss the
/// 500 ms `WAIT`: that renewal fails with a temporary error, as it should.
///
/// # Panics
///
/// On a permanent error, or when no renewal succeeds within 10 s.
async fn renew(holder: &xtr_lock::Lock) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    for tries in 1.. {
        match holder.refresh(None).await {
            Ok(()) => return tries,
            Err(err) if err.is_temporary() && Instant::now() < deadline => {
                eprintln!("renewal {tries}: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("the renewal on the new master failed: {err}"),
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_a_holder_keeps_its_lock_across_the_masters_death() {
    let began = Instant::now();
    let group = RedisSentinelGroup::start("durable");
    let dsn = format!("{}?wait_replicas=1&wait_timeout=0.5", group.dsn());
    let store = RedisStore::from_dsn(&dsn).unwrap();
    // Renewed every 5 s: the fail-over and the old master's return fit in one lease.
    let ttl = Duration::from_secs(15);
    let lock = |s: &RedisStore| {
        LockFactory::new(s.clone())
            .create_lock("kept")
            .with_ttl(Some(ttl))
    };
    let holder = lock(&store);
    holder.acquire().await.unwrap();
    let token = holder.fencing_token();
    let watch = holder.keep_alive().unwrap();
    let other_store = RedisStore::from_dsn(&dsn).unwrap();
    let other = lock(&other_store);
    assert!(!other.try_acquire().await.unwrap(), "excluded before");
    let killed = Instant::now();
    let group = tokio::task::spawn_blocking(move || {
        let mut group = group;
        let old = group.master_port();
        let new = group.kill_master();
        let switched = killed.elapsed();
        // The promoted replica has none of its own until the old master returns as one:
        // until then no write can be confirmed by `WAIT 1`.
        group.restart(old);
        eprintln!(
            "master {old} killed, {new} promoted after {switched:?}, {old} back as its replica \
             after {:?}",
            killed.elapsed()
        );
        group
    })
    .await
    .unwrap();
    // On the new master: still held, renewed (the renewal waits for the new replica), and
    // nobody else gets in.
    assert!(
        holder.is_acquired().await.unwrap(),
        "held on the new master"
    );
    let renewed = renew(&holder).await;
    assert!(!other.try_acquire().await.unwrap(), "still excluded after");
    tokio::time::sleep(ttl / 3 + Duration::from_secs(1)).await;
    assert!(
        watch.lost_now().is_none(),
        "no loss: {:?}",
        watch.lost_now()
    );
    assert_eq!(holder.fencing_token(), token);
    assert!(
        !other.try_acquire().await.unwrap(),
        "excluded after a renewal"
    );
    assert_eq!(holder.release().await.unwrap(), Release::Released);
    assert!(other.try_acquire().await.unwrap(), "free once released");
    assert_eq!(other.release().await.unwrap(), Release::Released);
    eprintln!(
        "renewed on the new master after {renewed} tries; test took {:?}",
        began.elapsed()
    );
    drop(group);
}

/// The master killed while tasks in two processes contend with `wait_replicas=1`: no two
/// holders at once, tokens never back, no confirmed lock lost, across the switch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_fail_over_under_contention_never_overlaps_nor_goes_back() {
    let group = RedisSentinelGroup::start("contended");
    let dsn = format!("{}?wait_replicas=1&wait_timeout=0.5", group.dsn());
    let resources: Vec<String> = (0..3).map(|i| format!("sentinel-failover-{i}")).collect();
    let group = fail_over_under_contention(&dsn, &resources, move || {
        let mut group = group;
        let old = group.master_port();
        let new = group.kill_master();
        let switched = Instant::now();
        // The promoted replica's own replica: the old master, back.
        group.restart(old);
        (
            group,
            format!("master {old} killed, {new} promoted at {switched:?}"),
        )
    })
    .await;
    drop(group);
}

/// A store that talked to the master before Sentinel switched it (a manual fail-over: the old
/// master lives on as a replica, and would answer writes with READONLY) works on the new
/// master from its next operation: its old connection is not used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_switch_the_store_writes_to_the_new_master_not_the_old_one() {
    let group = RedisSentinelGroup::start("switched");
    let store = RedisStore::from_dsn(&group.dsn()).unwrap();
    let lock = LockFactory::new(store.clone())
        .create_lock("moved")
        .with_ttl(Some(Duration::from_secs(30)));
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    let old = group.master_port();
    let (group, new) = tokio::task::spawn_blocking(move || {
        let new = group.failover();
        (group, new)
    })
    .await
    .unwrap();
    assert_ne!(new, old);
    // The sentinels' announcement may reach the store a moment after the switch: until then a
    // write may be refused, as a temporary error, never as a READONLY reply passed on.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lock.try_acquire().await {
            Ok(true) => break,
            Ok(false) => panic!("nobody else holds it"),
            Err(err) => {
                assert!(!err.to_string().contains("READONLY"), "{err}");
                assert!(Instant::now() < deadline, "still failing: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert_eq!(
        group.cli(new, &["EXISTS", "moved"]),
        "1",
        "on the new master"
    );
    assert_eq!(lock.release().await.unwrap(), Release::Released);
}
