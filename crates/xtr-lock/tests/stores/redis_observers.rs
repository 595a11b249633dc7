//! Observers (`watch_changes`, what elections' `observe()` and `leader --watch` rest on) on one
//! Redis server: this library's changes are announced to them, so an observer of a lock held by
//! one of ours reads nothing while it waits and wakes at the release; a holder that died is seen
//! at its lease's end; a peer's acquisition of a free lock is seen by polling.

use std::time::{Duration, Instant};

use xtr_lock::{Lockable as _, Release, Store as _};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{lock, store};

/// How many `ZRANGE` calls the server has run (an observer's look is two).
fn zranges(server: &RedisServer) -> u64 {
    zranges_in(&server.cli(&["INFO", "commandstats"]))
}

fn zranges_in(stats: &str) -> u64 {
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_zrange:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_is_told_of_a_release_and_does_not_poll_meanwhile() {
    let server = RedisServer::start();
    let store = store(&server);
    let holder = lock(&store, "observed", Duration::from_secs(60));
    holder.acquire().await.unwrap();
    let watcher = store
        .watch_changes("observed")
        .await
        .unwrap()
        .expect("Redis observes");
    // Polled meanwhile, as an observer's is.
    let watcher = tokio::spawn(watcher);
    // A look reads the lock's set and its queue: two ZRANGEs. Polling read 30 in 1.5 s; an
    // observer that is told looks once a second at most.
    let before = zranges(&server);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let read = zranges(&server) - before;
    assert!(
        read <= 4,
        "an observer of a held lock read {read} times in 1.5 s"
    );
    let released = Instant::now();
    assert_eq!(holder.release().await.unwrap(), Release::Released);
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the observer is told of the release")
        .unwrap();
    eprintln!("observer woken {:?} after the release", released.elapsed());
    // And of an acquisition by one of ours.
    let watcher = store.watch_changes("observed").await.unwrap().unwrap();
    let other = lock(&store, "observed", Duration::from_secs(60));
    other.acquire().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the observer is told of the acquisition");
    assert_eq!(other.release().await.unwrap(), Release::Released);
}

/// A holder that never releases (its process died): the observer wakes when its lease ends,
/// though nothing announces that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_dead_holders_lease_end() {
    let server = RedisServer::start();
    let store = store(&server);
    let holder = lock(&store, "dies", Duration::from_secs(1));
    holder.acquire().await.unwrap();
    let watcher = store.watch_changes("dies").await.unwrap().unwrap();
    let began = Instant::now();
    // As if its process died: the lock is left to run out.
    std::mem::forget(holder);
    tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("the observer sees the lease end");
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "woken before the lease ended: {took:?}"
    );
}

/// A peer's acquisition (a plain `ZADD` as Python's would write it) is not announced: the
/// observer of a free lock still sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_a_peers_acquisition_of_a_free_lock() {
    let server = RedisServer::start();
    let store = store(&server);
    let watcher = store.watch_changes("peer").await.unwrap().unwrap();
    let token = format!("{}=", "P".repeat(43));
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 30_000;
    server.cli(&["ZADD", "peer", &until.to_string(), &token]);
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the observer sees the peer's lock");
}

/// On a cluster the same, through the sharded channel of the lock's slot (`SPUBLISH`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_observer_is_told_of_a_release_and_does_not_poll_meanwhile() {
    use xtr_lock_testkit::redis_cluster::RedisCluster;
    let cluster = RedisCluster::start(3, 0);
    let store = xtr_lock::RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let name = "{observed}lock";
    let master = cluster.master_of_slot(RedisCluster::slot_of(name.as_bytes()));
    let reads = || zranges_in(&cluster.cli(master, &["INFO", "commandstats"]));
    let holder = lock(&store, name, Duration::from_secs(60));
    holder.acquire().await.unwrap();
    let watcher = tokio::spawn(store.watch_changes(name).await.unwrap().unwrap());
    let before = reads();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let read = reads() - before;
    assert!(
        read <= 4,
        "a cluster observer of a held lock read {read} times in 1.5 s"
    );
    assert_eq!(holder.release().await.unwrap(), Release::Released);
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the observer is told of the release")
        .unwrap();
}

/// Review finding: the scripts' announcement made every save and release of an ACL user
/// without channel rights fail (NOPERM), after their writes. It is ignored: such a user's locks
/// work, and its observers poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_channel_rights_saves_and_releases() {
    let server = RedisServer::start();
    server.cli(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">pw",
        "~*",
        "+@all",
        "resetchannels",
    ]);
    let dsn = format!("redis://app:pw@127.0.0.1:{}/0", server.port());
    let store = xtr_lock::RedisStore::from_dsn(&dsn).unwrap();
    let (a, b) = (
        lock(&store, "acl", Duration::from_secs(30)),
        lock(&store, "acl", Duration::from_secs(30)),
    );
    assert!(a.try_acquire().await.unwrap());
    assert!(!b.try_acquire().await.unwrap());
    let watcher = tokio::spawn(store.watch_changes("acl").await.unwrap().unwrap());
    assert_eq!(a.release().await.unwrap(), Release::Released);
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the observer polls and sees the release")
        .unwrap();
    assert!(b.try_acquire().await.unwrap());
    assert_eq!(b.release().await.unwrap(), Release::Released);
}
