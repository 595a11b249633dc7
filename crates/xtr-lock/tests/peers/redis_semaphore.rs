//! Counting semaphores on RedisStore with Symfony Semaphore 5.4 (Debian's
//! php-symfony-semaphore, phpredis) on the same sets, both ways: PHP holders and ours count
//! together, and never more than the limit hold at once.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use xtr_lock::{LockFactory, RedisStore, Semaphore};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, store};
use crate::support::peer::Peer;

fn sem(store: &RedisStore, resource: &str, limit: u32, permits: u32) -> Semaphore {
    LockFactory::new(store.clone())
        .with_ttl(Some(TTL))
        .create_semaphore(resource, limit)
        .unwrap()
        .permits(permits)
        .unwrap()
}

/// A PHP holder's command on `resource` (limit and weight fix its semaphore on first use).
fn php(op: &str, resource: &str, limit: u32, weight: u32) -> serde_json::Value {
    json!({"op": op, "resource": resource, "limit": limit, "weight": weight, "ttl": 30.0})
}

#[tokio::test]
async fn symfony_semaphore_holders_and_ours_count_together_both_ways() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut two = Peer::symfony_semaphore(server.port());
    assert_eq!(two.call_json(&php("try_acquire", "sf", 3, 2)), true);
    let ours_two = sem(&store, "sf", 3, 2);
    assert!(!ours_two.try_acquire().await.unwrap(), "PHP holds 2 of 3");
    let ours_one = sem(&store, "sf", 3, 1);
    assert!(
        ours_one.try_acquire().await.unwrap(),
        "the third permit is free"
    );
    let usage = ours_one.usage().await.unwrap();
    assert_eq!(usage.used, 3);
    let mut held: Vec<Option<u32>> = usage.holders.iter().map(|h| h.permits).collect();
    held.sort();
    assert_eq!(
        held,
        vec![Some(1), Some(2)],
        "PHP's holder is listed with its weight"
    );
    let mut one = Peer::symfony_semaphore(server.port());
    assert_eq!(
        one.call_json(&php("try_acquire", "sf", 3, 1)),
        false,
        "PHP is refused while ours holds the last permit"
    );
    assert_eq!(two.call_json(&php("is_acquired", "sf", 3, 2)), true);
    two.call_json(&php("refresh", "sf", 3, 2));
    two.call_json(&php("release", "sf", 3, 2));
    assert!(
        ours_two.try_acquire().await.unwrap(),
        "PHP's 2 permits came back"
    );
    assert_eq!(one.call_json(&php("try_acquire", "sf", 3, 1)), false);
    let _ = ours_one.release().await.unwrap();
    assert_eq!(
        one.call_json(&php("try_acquire", "sf", 3, 1)),
        true,
        "PHP takes the permit ours gave back"
    );
    let _ = ours_two.release().await.unwrap();
    one.call_json(&php("release", "sf", 3, 1));
    assert_eq!(server.cli(&["EXISTS", "{sf}:time", "{sf}:weight"]), "0");
}

#[tokio::test]
async fn symfony_semaphore_release_publishes_nothing_so_our_waiter_polls_and_gets_in() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut php_holder = Peer::symfony_semaphore(server.port());
    assert_eq!(
        php_holder.call_json(&php("try_acquire", "poll", 2, 2)),
        true
    );
    let ours = sem(&store, "poll", 2, 1);
    let waiting = tokio::spawn({
        let ours = ours.clone();
        async move { ours.acquire_timeout(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    php_holder.call_json(&php("release", "poll", 2, 2));
    assert!(
        waiting.await.unwrap().unwrap(),
        "a poll found the permits free"
    );
    assert!(ours.is_acquired().await.unwrap());
    let _ = ours.release().await.unwrap();
}

#[tokio::test]
async fn symfony_semaphore_and_ours_never_hold_more_than_the_limit_together() {
    let server = RedisServer::start();
    let store = store(&server);
    let (resource, counter) = ("mixed", "checker:mixed");
    // Two PHP processes (weights 1 and 2) and three holders of ours (weights 1, 1, 2), limit 3,
    // each adding its weight to a shared counter while it holds.
    let phps: Vec<_> = [("1", "25"), ("2", "15")]
        .iter()
        .map(|(weight, rounds)| {
            Peer::symfony_semaphore_cycle(server.port(), &[resource, "3", weight, rounds, counter])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ours = Vec::new();
    for weight in [1u32, 1, 2] {
        let s = sem(&store, resource, 3, weight);
        let mut conn = redis::Client::open(server.url(0))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        ours.push(tokio::spawn(async move {
            for _ in 0..20 {
                assert!(s.acquire_timeout(Duration::from_secs(20)).await.unwrap());
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
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .unwrap()
            .unwrap();
    }
    for php in phps {
        let out = php.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("rounds"));
    }
    assert_eq!(
        server.cli(&["GET", &format!("{counter}:over")]),
        "",
        "never above 3"
    );
    assert_eq!(server.cli(&["GET", counter]), "0");
}
