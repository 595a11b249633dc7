//! `wait_replicas`: a write counts only once the replicas have it, and a write they did not
//! confirm never costs a holder what it held before.

use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, RedisStore};

use crate::support::on_redis::master_and_replica;

const TTL: Duration = Duration::from_secs(60);

/// A promotion the replicas do not confirm fails, and the reader keeps its read lock on the
/// server as it believes: nobody else gets the write lock beside it. (The store used to take
/// the unconfirmed save back by deleting the holder's entry, read lock and all, while the lock
/// still believed it held its read lock: a second writer then got in.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_promotion_leaves_the_reader_its_lock() {
    let (master, replica) = master_and_replica();
    let dsn = format!("{}?wait_replicas=1&wait_timeout=0.5", master.url(0));
    let factory = LockFactory::new(RedisStore::from_dsn(&dsn).unwrap()).with_ttl(Some(TTL));
    let a = factory.create_lock("r");
    a.acquire_read().await.unwrap();
    // The replica stops confirming.
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let err = a.try_acquire().await.unwrap_err();
    let chain = std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ");
    assert!(chain.contains("wait_replicas"), "{chain}");
    assert!(
        a.held_mode().is_some(),
        "the reader still believes it holds"
    );
    let other = LockFactory::new(RedisStore::from_dsn(&master.url(0)).unwrap()).with_ttl(Some(TTL));
    let b = other.create_lock("r");
    assert!(
        !b.try_acquire().await.unwrap(),
        "a second writer got in while the reader believes it holds"
    );
    // A fresh acquisition the replicas do not confirm holds nothing.
    let c = factory.create_lock("fresh");
    assert!(c.try_acquire().await.is_err());
    assert!(c.held_mode().is_none());
    let d = other.create_lock("fresh");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !d.try_acquire().await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "the unconfirmed grant was never taken back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
