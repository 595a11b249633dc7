//! A quorum of members that keep their locks on a lease (pub/sub here) tells the quorum's
//! lease: the span members enough to meet the strategy are certain to hold. It used to tell
//! none, so `xtr-lock run` on such a quorum had no lease to stop a stopped holder's command by.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::store::{CombinedStore, ConsensusStrategy};
use xtr_lock::{LockFactory, Lockable as _, RedisPubSubStore, Store};
use xtr_lock_testkit::redis::RedisServer;

/// Polls `f` until it holds, for up to `limit`.
async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_of_leased_members_keeps_the_lease_of_its_majority() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let members: Vec<Arc<dyn Store>> = servers
        .iter()
        .map(|s| {
            Arc::new(
                RedisPubSubStore::from_dsn(&format!("redis+pubsub://127.0.0.1:{}", s.port()))
                    .unwrap(),
            ) as Arc<dyn Store>
        })
        .collect();
    let store = Arc::new(CombinedStore::new(members, ConsensusStrategy).unwrap());
    assert!(store.capabilities().leased);
    let lock = LockFactory::new(store.clone()).create_lock("quorum-lease");
    assert!(lock.try_acquire().await.unwrap());
    let lease = || store.lease_remaining(lock.key());
    let left = lease().expect("a quorum of leased members has a lease");
    assert!(left <= Duration::from_secs(1), "{left:?}");

    // One member silent: the other two still renew theirs, and they are a majority.
    servers[0].pause();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let left = lease().expect("a lease");
    assert!(
        left >= Duration::from_millis(200),
        "one silent member of three: {left:?}"
    );

    // Two silent: no majority renews, and the quorum's lease runs out with theirs.
    servers[1].pause();
    assert!(
        eventually(Duration::from_secs(3), || lease()
            .is_none_or(|l| l.is_zero()))
        .await,
        "two silent members of three, still {:?}",
        lease()
    );
    servers[0].resume();
    servers[1].resume();
}
