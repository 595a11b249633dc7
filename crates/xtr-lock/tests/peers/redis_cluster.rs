//! RedisStore on a 3-master Redis Cluster with Symfony Lock 5.4 and Symfony Semaphore 5.4
//! (Debian's packages, phpredis's `RedisCluster`) on the same keys: the resource key is the
//! peers' own on a cluster too, so they exclude each other on every master, with or without a
//! hash tag in the name. Symfony publishes nothing: our waiters find its releases by polling.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use xtr_lock::{LockFactory, Lockable as _, RedisStore, Semaphore, StoreFactory};
use xtr_lock_testkit::redis_cluster::RedisCluster;

use crate::support::on_redis::{TTL, lock};
use crate::support::peer::{Peer, Php};

/// For each master, in port order, the first name `<stem>-<n>` whose key it serves.
fn names_on_each_master(cluster: &RedisCluster, stem: &str) -> Vec<String> {
    cluster
        .masters()
        .iter()
        .map(|&master| {
            (0..)
                .map(|n| format!("{stem}-{n}"))
                .find(|name| {
                    cluster.master_of_slot(RedisCluster::slot_of(name.as_bytes())) == master
                })
                .unwrap()
        })
        .collect()
}

/// The value of `key` on the master that serves it.
fn on_its_master(cluster: &RedisCluster, args: &[&str], key: &str) -> String {
    let master = cluster.master_of_slot(RedisCluster::slot_of(key.as_bytes()));
    cluster.cli(master, args)
}

#[tokio::test]
async fn symfony_and_ours_exclude_each_other_on_every_master_both_ways() {
    let cluster = RedisCluster::start(3, 0);
    let store = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let mut php = Peer::symfony_cluster(&cluster.masters());
    let mut names = names_on_each_master(&cluster, "sf");
    // A hash tag in the name: its slot is the tag's, for the peer's key and our companions.
    names.push("{tenant-7}:invoice".to_owned());
    let masters: std::collections::HashSet<u16> = names
        .iter()
        .map(|n| cluster.master_of_slot(RedisCluster::slot_of(n.as_bytes())))
        .collect();
    assert_eq!(masters.len(), 3, "the names cover every master");
    for name in &names {
        // Symfony holds: ours is refused, then waits and gets in after PHP releases.
        assert_eq!(php.call_ttl("try_write", name, Some(30.0)), true, "{name}");
        let ours = lock(&store, name, TTL);
        assert!(!ours.try_acquire().await.unwrap(), "{name}");
        assert!(!ours.try_acquire_read().await.unwrap(), "{name}");
        let waiting = tokio::spawn({
            let ours = ours.clone();
            async move { ours.acquire_timeout(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!waiting.is_finished(), "{name}: ours waits while PHP holds");
        php.call("release", name);
        assert!(
            waiting.await.unwrap().unwrap(),
            "{name}: a poll found PHP's release"
        );
        // Ours holds: Symfony is refused, for writing and reading.
        assert_eq!(php.call("try_write", name), false, "{name}");
        assert_eq!(php.call("try_read", name), false, "{name}");
        assert_eq!(on_its_master(&cluster, &["EXISTS", name], name), "1");
        let _ = ours.release().await.unwrap();
        assert_eq!(php.call("try_write", name), true, "{name}: free again");
        php.call("release", name);
        assert_eq!(on_its_master(&cluster, &["EXISTS", name], name), "0");
    }
}

#[tokio::test]
async fn symfony_readers_and_ours_share_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let store = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let mut php = Peer::symfony_cluster(&cluster.masters());
    for name in names_on_each_master(&cluster, "rw") {
        let ours = lock(&store, &name, TTL);
        assert!(ours.try_acquire_read().await.unwrap());
        assert_eq!(php.call_ttl("try_read", &name, Some(30.0)), true, "{name}");
        assert!(!ours.try_acquire().await.unwrap(), "no promotion: {name}");
        php.call("release", &name);
        assert!(
            ours.try_acquire().await.unwrap(),
            "the sole reader promotes"
        );
        let _ = ours.release().await.unwrap();
    }
}

fn sem(store: &RedisStore, resource: &str, limit: u32, permits: u32) -> Semaphore {
    LockFactory::new(store.clone())
        .with_ttl(Some(TTL))
        .create_semaphore(resource, limit)
        .unwrap()
        .permits(permits)
        .unwrap()
}

fn php_sem(op: &str, resource: &str, limit: u32, weight: u32) -> serde_json::Value {
    json!({"op": op, "resource": resource, "limit": limit, "weight": weight, "ttl": 30.0})
}

#[tokio::test]
async fn symfony_semaphore_holders_and_ours_count_together_on_every_master() {
    let cluster = RedisCluster::start(3, 0);
    let store = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let mut two = Peer::symfony_semaphore_cluster(&cluster.masters());
    let mut one = Peer::symfony_semaphore_cluster(&cluster.masters());
    for name in names_on_each_master(&cluster, "sem") {
        assert_eq!(two.call_json(&php_sem("try_acquire", &name, 3, 2)), true);
        let ours_two = sem(&store, &name, 3, 2);
        assert!(!ours_two.try_acquire().await.unwrap(), "PHP holds 2 of 3");
        let ours_one = sem(&store, &name, 3, 1);
        assert!(ours_one.try_acquire().await.unwrap(), "the third is free");
        assert_eq!(ours_one.usage().await.unwrap().used, 3, "{name}");
        assert_eq!(
            one.call_json(&php_sem("try_acquire", &name, 3, 1)),
            false,
            "PHP is refused while ours holds the last permit ({name})"
        );
        // PHP gives back 2: our waiter polls and gets in.
        let waiting = tokio::spawn({
            let ours_two = ours_two.clone();
            async move { ours_two.acquire_timeout(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        two.call_json(&php_sem("release", &name, 3, 2));
        assert!(waiting.await.unwrap().unwrap(), "{name}");
        let _ = ours_one.release().await.unwrap();
        assert_eq!(one.call_json(&php_sem("try_acquire", &name, 3, 1)), true);
        let _ = ours_two.release().await.unwrap();
        one.call_json(&php_sem("release", &name, 3, 1));
        let time = format!("{{{name}}}:time");
        assert_eq!(on_its_master(&cluster, &["EXISTS", &time], &time), "0");
    }
}

#[tokio::test]
async fn symfony_semaphore_and_ours_never_hold_more_than_the_limit_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let store = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let masters = cluster.masters();
    // The counter shares the semaphore's slot, so one master sees both.
    let (resource, counter) = ("mixed", "{mixed}:checker");
    let phps: Vec<_> = [("1", "20"), ("2", "12")]
        .iter()
        .map(|(weight, rounds)| {
            Peer::symfony_semaphore_cycle_on(
                &Php::Cluster(&masters),
                &[resource, "3", weight, rounds, counter],
            )
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let seeds: Vec<String> = masters
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let client = redis::cluster::ClusterClient::new(seeds).unwrap();
    let mut ours = Vec::new();
    for weight in [1u32, 1, 2] {
        let s = sem(&store, resource, 3, weight);
        let mut conn = client.get_async_connection().await.unwrap();
        ours.push(tokio::spawn(async move {
            for _ in 0..15 {
                assert!(s.acquire_timeout(Duration::from_secs(30)).await.unwrap());
                let now: i64 = redis::cmd("INCRBY")
                    .arg(counter)
                    .arg(weight)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if now > 3 {
                    let _: i64 = redis::cmd("INCR")
                        .arg(format!("{counter}:over"))
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                let _: i64 = redis::cmd("DECRBY")
                    .arg(counter)
                    .arg(weight)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let _ = s.release().await.unwrap();
            }
        }));
    }
    for task in ours {
        tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .unwrap()
            .unwrap();
    }
    for php in phps {
        let out = php.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("rounds"));
    }
    let over = format!("{counter}:over");
    assert_eq!(
        on_its_master(&cluster, &["GET", &over], &over),
        "",
        "never above 3"
    );
    assert_eq!(on_its_master(&cluster, &["GET", counter], counter), "0");
}

#[tokio::test]
async fn symfonys_cluster_dsn_form_builds_a_working_cluster_store() {
    let cluster = RedisCluster::start(3, 0);
    let hosts: Vec<String> = cluster
        .masters()
        .iter()
        .map(|p| format!("host[127.0.0.1:{p}]"))
        .collect();
    let dsn = format!("redis:?{}&redis_cluster=1", hosts.join("&"));
    // Through the factory, as a configuration file or the command line would.
    let symfony_form = LockFactory::from_arc(StoreFactory::create_store(&dsn).unwrap());
    let shown = StoreFactory::create_store(&dsn).unwrap().to_string();
    assert!(shown.contains("cluster"), "{shown}");
    let ours = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let mut php = Peer::symfony_cluster(&cluster.masters());
    for name in names_on_each_master(&cluster, "dsn") {
        let held = symfony_form.create_lock(&name).with_ttl(Some(TTL));
        assert!(held.try_acquire().await.unwrap(), "{name}");
        // Written on the master that serves the key, seen by the other store and by PHP.
        assert_eq!(on_its_master(&cluster, &["EXISTS", &name], &name), "1");
        assert!(!lock(&ours, &name, TTL).try_acquire().await.unwrap());
        assert_eq!(php.call_ttl("try_write", &name, Some(30.0)), false);
        // A release through one form wakes a waiter of the other at once (sharded publish).
        let other = lock(&ours, &name, TTL);
        let waiting = tokio::spawn({
            let other = other.clone();
            async move { other.acquire_timeout(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        let _ = held.release().await.unwrap();
        assert!(waiting.await.unwrap().unwrap(), "{name}");
        let _ = other.release().await.unwrap();
    }
}
