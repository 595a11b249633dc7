//! The Redis store's subscriber connections: first waits on many slots of a cluster at once
//! each get their wake, and a dropped store leaves no connection behind.

use std::time::Duration;

use xtr_lock::{LockFactory, Lockable as _, RedisStore};
use xtr_lock_testkit::redis::RedisServer;
use xtr_lock_testkit::redis_cluster::RedisCluster;

const TTL: Duration = Duration::from_secs(60);

/// Six first waits on six resources (several slots) of a fresh store at once. Each opening of
/// the subscriber connection used to drop the one another wait had just opened, and a waiter
/// whose slot counted as subscribed on the dropped connection was never woken (it waited for
/// its holder's 60 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_waits_on_many_slots_at_once_are_all_woken() {
    let cluster = RedisCluster::start(3, 0);
    let holders =
        LockFactory::new(RedisStore::from_dsn(&cluster.dsn()).unwrap()).with_ttl(Some(TTL));
    for round in 0..4 {
        let names: Vec<String> = (0..6).map(|i| format!("res{i}-{round}")).collect();
        let held: Vec<_> = names.iter().map(|n| holders.create_lock(n)).collect();
        for h in &held {
            h.acquire().await.unwrap();
        }
        let waiting =
            LockFactory::new(RedisStore::from_dsn(&cluster.dsn()).unwrap()).with_ttl(Some(TTL));
        let tasks: Vec<_> = names
            .iter()
            .map(|n| {
                let w = waiting.create_lock(n);
                tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_secs(8), w.acquire())
                        .await
                        .is_ok()
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for h in &held {
            assert_eq!(h.release().await.unwrap(), xtr_lock::Release::Released);
        }
        for (n, t) in names.iter().zip(tasks) {
            assert!(
                t.await.unwrap(),
                "round {round}: the waiter on {n} was never woken"
            );
        }
    }
}

/// Client connections of every node of `ports`.
fn clients(ports: &[u16]) -> usize {
    ports
        .iter()
        .map(|p| {
            let out = std::process::Command::new("redis-cli")
                .args(["-p", &p.to_string(), "CLIENT", "LIST"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).lines().count()
        })
        .sum()
}

/// A store that waited (so it subscribed) and is dropped closes its subscriber connections.
async fn dropped_stores_leave_nothing(dsn: &str, ports: &[u16]) {
    let holders = LockFactory::new(RedisStore::from_dsn(dsn).unwrap()).with_ttl(Some(TTL));
    let mut counts = Vec::new();
    for i in 0..5 {
        let h = holders.create_lock(format!("d{i}"));
        h.acquire().await.unwrap();
        {
            let wf = LockFactory::new(RedisStore::from_dsn(dsn).unwrap()).with_ttl(Some(TTL));
            let w = wf.create_lock(format!("d{i}"));
            let t = tokio::spawn(async move {
                w.acquire().await.unwrap();
                assert_eq!(w.release().await.unwrap(), xtr_lock::Release::Released);
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(h.release().await.unwrap(), xtr_lock::Release::Released);
            t.await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        counts.push(clients(ports));
    }
    assert!(
        counts.windows(2).all(|w| w[1] <= w[0]),
        "connections grow with each dropped store: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_store_closes_its_subscriber_on_one_server() {
    let server = RedisServer::start();
    dropped_stores_leave_nothing(&server.url(0), &[server.port()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_store_closes_its_subscribers_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    dropped_stores_leave_nothing(&cluster.dsn(), &cluster.ports()).await;
}
