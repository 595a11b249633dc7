//! Fencing tokens on Redis: strictly increasing across stores, connections and processes
//! (this test binary runs itself again as the other processes).

use xtr_lock::{Lockable as _, RedisStore};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, lock, store};

#[tokio::test]
async fn fencing_tokens_increase_across_stores_and_connections() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let mut last = 0;
    for i in 0..20 {
        let s = if i % 2 == 0 { &a } else { &b };
        let l = lock(s, "fenced", TTL);
        assert!(l.try_acquire().await.unwrap());
        let t = l.fencing_token().unwrap();
        assert!(t > last, "{t} > {last}");
        assert!(l.try_acquire().await.unwrap());
        assert_eq!(l.fencing_token(), Some(t), "a re-save keeps the token");
        last = t;
        let _ = l.release().await.unwrap();
    }
    // The counter is a separate key, never a member of the lock's set.
    let mut conn = redis::Client::open(server.url(0))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let kind: String = redis::cmd("TYPE")
        .arg(a.internal_key("fence"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "string");
    assert_eq!(server.cli(&["ZCARD", "fenced"]), "0");
}

/// Acquires `rounds` times on `dsn`, recording each fencing token in a Redis list from inside
/// the lock, so the list is in acquisition order across every process doing the same.
async fn fence_rounds(dsn: &str, rounds: usize) {
    let store = RedisStore::from_dsn(dsn).unwrap();
    let client = redis::Client::open(dsn).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for _ in 0..rounds {
        let l = lock(&store, "fenced-xproc", TTL);
        l.acquire().await.unwrap();
        let token = l.fencing_token().unwrap();
        let _: () = redis::cmd("RPUSH")
            .arg("fence-log")
            .arg(token)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _ = l.release().await.unwrap();
    }
}

fn fence_log(server: &RedisServer) -> Vec<u64> {
    server
        .cli(&["LRANGE", "fence-log", "0", "-1"])
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

/// The other processes of [`fencing_is_strictly_increasing_across_processes`]: with
/// `XTR_FENCE_DSN` set it only records; run on its own it checks one process.
#[tokio::test]
async fn fencing_child() {
    if let Ok(dsn) = std::env::var("XTR_FENCE_DSN") {
        fence_rounds(&dsn, 30).await;
        return;
    }
    let server = RedisServer::start();
    fence_rounds(&server.url(0), 10).await;
    let log = fence_log(&server);
    assert_eq!(log.len(), 10);
    assert!(log.windows(2).all(|w| w[0] < w[1]), "{log:?}");
}

#[tokio::test]
async fn fencing_is_strictly_increasing_across_processes() {
    let server = RedisServer::start();
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "redis_fencing::fencing_child", "--nocapture"])
                .env("XTR_FENCE_DSN", server.url(0))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    fence_rounds(&server.url(0), 30).await;
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let log = fence_log(&server);
    assert_eq!(log.len(), 90, "three processes, thirty acquisitions each");
    assert!(
        log.windows(2).all(|w| w[0] < w[1]),
        "in acquisition order: {log:?}"
    );
}
