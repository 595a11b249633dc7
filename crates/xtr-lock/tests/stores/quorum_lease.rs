//! A quorum of members that keep their locks on a lease (pub/sub here) tells the quorum's
//! lease: the span members enough to meet the strategy are certain to hold. It used to tell
//! none, so `xtr-lock run` on such a quorum had no lease to stop a stopped holder's command by.
//! Only members that hold count: a member that refused or failed used to count as holding for
//! ever (no lease at all, while the quorum stood on one leased member), and a session lock on a
//! server that never ends silent sessions as holding for no time (a lease of 0 at once).

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::store::{CombinedStore, ConsensusStrategy, UnanimousStrategy};
use xtr_lock::{LockFactory, Lockable as _, PgAdvisoryStore, RedisPubSubStore, RedisStore, Store};
use xtr_lock_testkit::postgres::PostgresServer;
use xtr_lock_testkit::redis::RedisServer;

fn pubsub(server: &RedisServer) -> Arc<dyn Store> {
    Arc::new(
        RedisPubSubStore::from_dsn(&format!("redis+pubsub://127.0.0.1:{}", server.port())).unwrap(),
    )
}

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
    let members: Vec<Arc<dyn Store>> = servers.iter().map(pubsub).collect();
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

/// A quorum standing on one leased member and one that does not lease: a third member that
/// failed to store counts for nothing, so the quorum's lease is the leased member's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_holds_nothing_does_not_lengthen_the_quorums_lease() {
    let leased = RedisServer::start();
    let (mut down, up) = (RedisServer::start(), RedisServer::start());
    let redis = |s: &RedisServer| {
        Arc::new(RedisStore::from_dsn(&format!("redis://127.0.0.1:{}/0", s.port())).unwrap())
            as Arc<dyn Store>
    };
    let members = vec![pubsub(&leased), redis(&down), redis(&up)];
    down.kill();
    let store = Arc::new(CombinedStore::new(members, ConsensusStrategy).unwrap());
    let lock = LockFactory::new(store.clone()).create_lock("quorum-lease:one-down");
    assert!(lock.try_acquire().await.unwrap());
    let lease = || store.lease_remaining(lock.key());
    let left = lease().expect("the quorum stands on a leased member: a lease");
    assert!(left <= Duration::from_secs(1), "{left:?}");

    leased.pause();
    assert!(
        eventually(Duration::from_secs(3), || lease()
            .is_some_and(|l| l.is_zero()))
        .await,
        "the leased member went silent, still {:?}",
        lease()
    );
    leased.resume();
}

/// A member whose server never ends a silent session (PostgreSQL on a Unix socket, no
/// `idle_session_timeout`) holds for as long as the lock lasts; with a pub/sub member under a
/// unanimous strategy, the quorum's lease is the pub/sub member's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_never_times_out_does_not_cut_the_quorums_lease() {
    let pg = PostgresServer::start();
    let redis = RedisServer::start();
    let dsn = format!(
        "postgresql+advisory://postgres@localhost/postgres?host={}&port={}",
        pg.socket_dir().display(),
        pg.port()
    );
    let advisory = Arc::new(PgAdvisoryStore::from_dsn(&dsn).unwrap());
    let alone = LockFactory::new(advisory.clone()).create_lock("quorum-lease:alone");
    assert!(alone.try_acquire().await.unwrap());
    assert_eq!(
        advisory.lease_remaining(alone.key()),
        Some(Duration::MAX),
        "held on a session nothing ends"
    );
    let _ = alone.release().await.unwrap();

    let members: Vec<Arc<dyn Store>> = vec![advisory, pubsub(&redis)];
    let store = Arc::new(CombinedStore::new(members, UnanimousStrategy).unwrap());
    let lock = LockFactory::new(store.clone()).create_lock("quorum-lease:session");
    assert!(lock.try_acquire().await.unwrap());
    for _ in 0..5 {
        let left = store.lease_remaining(lock.key()).expect("a lease");
        assert!(
            left > Duration::ZERO && left <= Duration::from_secs(1),
            "the pub/sub member's lease, not the session's: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = lock.release().await.unwrap();
    assert_eq!(store.lease_remaining(lock.key()), None, "nothing held");
}

/// A member that stops answering after the acquisition (a paused Redis server) is left to
/// finish in the background at each renewal: its last answer said it holds, but its key
/// expires unrenewed, so it counts for nothing; it used to count as holding for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_left_answering_in_the_background_counts_for_nothing() {
    let leased = RedisServer::start();
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let redis = |s: &RedisServer| {
        Arc::new(
            RedisStore::from_dsn(&format!(
                "redis://127.0.0.1:{}/0?socket_timeout=5",
                s.port()
            ))
            .unwrap(),
        ) as Arc<dyn Store>
    };
    let members = vec![pubsub(&leased), redis(&a), redis(&b)];
    let store = Arc::new(CombinedStore::new(members, ConsensusStrategy).unwrap());
    let lock = LockFactory::new(store.clone())
        .create_lock("quorum-lease:paused")
        .with_ttl(Some(Duration::from_secs(30)));
    assert!(lock.try_acquire().await.unwrap());
    // The member that answered after the quorum was decided is counted once its answer comes.
    assert!(
        eventually(Duration::from_secs(3), || store.lease_remaining(lock.key())
            == Some(Duration::MAX))
        .await,
        "two Redis members hold for the lock's lifetime: {:?}",
        store.lease_remaining(lock.key())
    );
    b.pause();
    lock.refresh(None).await.unwrap();
    let left = store.lease_remaining(lock.key()).expect("a lease");
    assert!(
        left <= Duration::from_secs(1),
        "the quorum stands on the pub/sub member now: {left:?}"
    );
    b.resume();
    let _ = lock.release().await.unwrap();
}
