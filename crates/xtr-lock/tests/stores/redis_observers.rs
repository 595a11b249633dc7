//! Observers (`watch_changes`, what elections' `observe()` and `leader --watch` rest on) on one
//! Redis server: this library's changes are announced to them, so an observer of a lock held by
//! one of ours reads nothing while it waits and wakes at the release; a holder that died is seen
//! at its lease's end; a peer's acquisition of a free lock is seen by polling.

use std::time::{Duration, Instant};

use xtr_lock::{Lockable as _, Release, Store as _};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{lock, store};

/// How many `ZRANGE` calls the server has run (an observer's look is one).
fn zranges(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
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
    let before = zranges(&server);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let looks = zranges(&server) - before;
    assert!(
        looks <= 1,
        "an observer of a held lock looked {looks} times in 1 s"
    );
    let released = Instant::now();
    assert_eq!(holder.release().await.unwrap(), Release::Released);
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the observer is told of the release");
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
