//! The Redis store's deployments side by side: a quorum whose members are a Redis Cluster, a
//! Sentinel group and one server; and what the DSN of each says about where its locks are.

use std::time::Duration;

use xtr_lock::store::{CombinedStore, ConsensusStrategy};
use xtr_lock::{LockFactory, Lockable as _, RedisStore, Store as _};
use xtr_lock_testkit::redis::RedisServer;
use xtr_lock_testkit::redis_cluster::RedisCluster;
use xtr_lock_testkit::redis_sentinel::RedisSentinelGroup;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_of_a_cluster_a_sentinel_group_and_a_server_excludes_and_outlives_a_member() {
    let cluster = RedisCluster::start(3, 0);
    let group = RedisSentinelGroup::start("quorum");
    let server = RedisServer::start();
    let dsns = [cluster.dsn(), group.dsn(), server.url(0)];
    let refs: Vec<&str> = dsns.iter().map(String::as_str).collect();
    let factory = LockFactory::new(CombinedStore::from_dsns(&refs, ConsensusStrategy).unwrap());
    let (a, b) = (
        factory.create_lock("job:{7}").with_ttl(TTL),
        factory.create_lock("job:{7}").with_ttl(TTL),
    );
    assert!(a.try_acquire().await.unwrap());
    assert!(
        !b.try_acquire().await.unwrap(),
        "the quorum excludes a second holder"
    );
    assert_eq!(a.release().await.unwrap(), xtr_lock::Release::Released);
    assert!(b.try_acquire().await.unwrap());
    // The whole cluster goes: the Sentinel group and the server are still a majority.
    drop(cluster);
    assert!(
        !a.try_acquire().await.unwrap(),
        "still held on the two members left"
    );
    assert_eq!(b.release().await.unwrap(), xtr_lock::Release::Released);
    assert!(
        a.try_acquire().await.unwrap(),
        "two of three members grant it"
    );
    assert_eq!(a.release().await.unwrap(), xtr_lock::Release::Released);
}

#[test]
fn each_deployment_says_where_its_locks_are_without_credentials() {
    let cases = [
        (
            "redis+cluster://u:hunter2@a:7000,b:7001?prefix=app%3A",
            "redis+cluster://a:7000,b:7001?prefix=app%3A",
        ),
        (
            "redis:?host[a:7000]&host[b:7001]&redis_cluster=1",
            "redis+cluster://a:7000,b:7001",
        ),
        (
            "redis+sentinel://:hunter2@s1,s2/mymaster/3",
            "redis+sentinel://s1:26379,s2:26379/mymaster/3",
        ),
    ];
    for (dsn, place) in cases {
        let store = RedisStore::from_dsn(dsn).unwrap();
        assert_eq!(store.locks_in().as_deref(), Some(place), "{dsn}");
        assert!(!format!("{store:?} {store}").contains("hunter2"));
        // What locks_in says reaches the same locks.
        let again = RedisStore::from_dsn(place).unwrap();
        assert_eq!(again.locks_in().as_deref(), Some(place));
    }
    let err = RedisStore::from_dsn("redis+cluster://a:7000?prefix=x%7B%7Dy").unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
}

/// Symfony's DSN form for a password-protected server, as its PHP application spells it:
/// the password before the `?`, the database as `dbindex`, PHP client options beside. The
/// lock lands in that database; without the password the server refuses, and the error says
/// so without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symfonys_dsn_with_a_password_and_dbindex_reaches_the_database() {
    let server = RedisServer::start_with(&["--requirepass", "s3cr%t"]);
    let port = server.port();
    let dsn = format!("redis:s3cr%25t@?host[127.0.0.1:{port}]&dbindex=3&timeout=2&persistent=1");
    let lock = LockFactory::new(RedisStore::from_dsn(&dsn).unwrap())
        .create_lock("symfony-auth")
        .with_ttl(TTL);
    assert!(lock.try_acquire().await.unwrap());
    let stored = server.cli(&[
        "-a",
        "s3cr%t",
        "--no-auth-warning",
        "-n",
        "3",
        "EXISTS",
        "symfony-auth",
    ]);
    assert_eq!(stored, "1", "the lock is in database 3");
    assert_eq!(lock.release().await.unwrap(), xtr_lock::Release::Released);
    let without = format!("redis:?host[127.0.0.1:{port}]&dbindex=3");
    let lock = LockFactory::new(RedisStore::from_dsn(&without).unwrap())
        .create_lock("symfony-auth")
        .with_ttl(TTL);
    let err = lock
        .try_acquire()
        .await
        .expect_err("no password")
        .to_string();
    assert!(!err.contains("s3cr"), "{err}");
}
