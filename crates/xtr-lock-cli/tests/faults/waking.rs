//! Waiters in several processes on one Redis lock: every one gets it, and each release wakes
//! exactly one process (counted in scripts the server ran, not in time).

use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, RedisStore};
use xtr_lock_testkit::redis::RedisServer;

use crate::common::spawn;

/// The tickets in `resource`'s wait queue (the key, with its `0xFF` byte, is spelled in Lua).
fn queued(server: &RedisServer, resource: &str) -> usize {
    server
        .cli(&[
            "EVAL",
            "return redis.call('ZCARD', '\\255xtr-lock:queue:' .. ARGV[1])",
            "0",
            resource,
        ])
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_release_wakes_one_process_and_every_waiting_process_gets_the_lock() {
    let server = RedisServer::start();
    let dsn = server.url(0);
    let run = [
        "run", "--store", &dsn, "--ttl", "60s", "multi", "--", "true",
    ];

    let store = RedisStore::from_dsn(&dsn).unwrap();
    let holder = LockFactory::new(store)
        .with_ttl(Some(Duration::from_secs(60)))
        .create_lock("multi");
    holder.acquire().await.unwrap();
    const PROCESSES: usize = 6;
    let waiting: Vec<_> = (0..PROCESSES).map(|_| spawn(&run)).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while queued(&server, "multi") < PROCESSES {
        assert!(Instant::now() < deadline, "the processes never all queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.cli(&["CONFIG", "RESETSTAT"]);
    let _ = holder.release().await.unwrap();
    for child in waiting {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
            .await
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // The holder's release, then each process's save and release: no process was woken for a
    // release another one won (one wake per process per release would have cost a refused save
    // per other waiting process per release: 15 more here).
    assert_eq!(server.command_calls("evalsha"), 1 + 2 * PROCESSES as u64);
    assert_eq!(queued(&server, "multi"), 0);
}
