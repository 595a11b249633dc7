//! RedisStore with the peers on the same keys, against real throwaway servers: Python
//! xtr-lock 4.1.0 (from PyPI, in a venv the testkit makes) and Symfony Lock 5.4 (Debian's
//! php-symfony-lock), in both directions.

use std::time::{Duration, Instant};

use xtr_lock::{Lockable as _, Mode};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, lock, store};
use crate::support::peer::Peer;

// ---- Python xtr-lock 4.1.0 -------------------------------------------------------------------------

#[tokio::test]
async fn python_and_rust_exclude_each_other_both_ways() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut py = Peer::python("redis", &server.url(0));
    assert_eq!(py.call_ttl("try_write", "py-first", Some(30.0)), true);
    let ours = lock(&store, "py-first", TTL);
    assert!(!ours.try_acquire().await.unwrap());
    assert!(!ours.try_acquire_read().await.unwrap());
    // Python never publishes: our waiter finds the release by polling.
    let wait = tokio::spawn({
        let ours = ours.clone();
        async move { ours.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    py.call("release", "py-first");
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(py.call("is_acquired", "py-first"), false);
    assert_eq!(
        py.call("try_write", "py-first"),
        false,
        "Python is excluded by our lock"
    );
    assert_eq!(py.call("try_read", "py-first"), false);
    let _ = ours.release().await.unwrap();
    assert_eq!(py.call("try_write", "py-first"), true);
}

#[tokio::test]
async fn python_and_rust_readers_share_and_promote_and_demote() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut py = Peer::python("redis", &server.url(0));
    let ours = lock(&store, "rw", TTL);
    assert!(ours.try_acquire_read().await.unwrap());
    assert_eq!(
        py.call_ttl("try_read", "rw", Some(30.0)),
        true,
        "readers share"
    );
    assert!(
        !ours.try_acquire().await.unwrap(),
        "no promotion while Python reads"
    );
    assert_eq!(ours.held_mode(), Some(Mode::Read));
    assert!(ours.is_acquired().await.unwrap());
    assert_eq!(
        py.call("try_write", "rw"),
        false,
        "Python cannot promote either"
    );
    py.call("release", "rw");
    assert!(
        ours.try_acquire().await.unwrap(),
        "the sole reader promotes"
    );
    assert_eq!(py.call("try_read", "rw"), false);
    assert!(ours.try_acquire_read().await.unwrap(), "demoted");
    assert_eq!(
        py.call("try_read", "rw"),
        true,
        "Python joins after the demotion"
    );
    let _ = ours.release().await.unwrap();
    py.call("release", "rw");
    assert_eq!(server.cli(&["EXISTS", "rw"]), "0");
}

#[tokio::test]
async fn an_expired_python_lock_is_taken_over_and_a_python_key_holds_for_rust() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut py = Peer::python("redis", &server.url(0));
    assert_eq!(py.call_ttl("try_write", "py-expiry", Some(0.3)), true);
    let ours = lock(&store, "py-expiry", TTL);
    let started = Instant::now();
    ours.acquire().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        py.call("is_acquired", "py-expiry"),
        false,
        "Python sees its lock lost"
    );
    let _ = ours.release().await.unwrap();
}

// ---- Symfony Lock 5.4 ------------------------------------------------------------------------------

#[tokio::test]
async fn symfony_and_rust_exclude_each_other_both_ways() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut php = Peer::symfony(server.port());
    assert_eq!(php.call_ttl("try_write", "sf", Some(30.0)), true);
    let ours = lock(&store, "sf", TTL);
    assert!(!ours.try_acquire().await.unwrap());
    assert!(!ours.try_acquire_read().await.unwrap());
    php.call("release", "sf");
    assert!(ours.try_acquire().await.unwrap());
    assert_eq!(
        php.call("try_write", "sf"),
        false,
        "Symfony is excluded by our lock"
    );
    assert_eq!(php.call("try_read", "sf"), false);
    assert!(ours.try_acquire_read().await.unwrap());
    assert_eq!(
        php.call("try_read", "sf"),
        true,
        "readers share across languages"
    );
    assert!(
        !ours.try_acquire().await.unwrap(),
        "no promotion while Symfony reads"
    );
    php.call("release", "sf");
    assert!(ours.try_acquire().await.unwrap());
    let _ = ours.release().await.unwrap();
    assert_eq!(server.cli(&["EXISTS", "sf"]), "0");
}
