//! Redis under hostile input: resource names that look like the store's own keys, data at a
//! resource's key that is not a lock, a server restarted empty. Each test failed before its fix.

use xtr_lock::{ErrorKind, Lockable as _, RedisStore, Release, Store as _};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, lock, store};
use crate::support::root;

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url(0))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The Python peer's probe key is a resource name like any other: a new process's clock probe
/// must not overwrite a lock held on it.
#[tokio::test]
async fn the_clock_probe_never_writes_a_resource_key() {
    let server = RedisServer::start();
    let holder = lock(&store(&server), "__xtr_lock_time_probe__", TTL);
    assert!(holder.try_acquire().await.unwrap());
    // A new store probes on its first save.
    let newcomer = store(&server);
    assert!(lock(&newcomer, "other", TTL).try_acquire().await.unwrap());
    let rival = lock(&newcomer, "__xtr_lock_time_probe__", TTL);
    assert!(
        !rival.try_acquire().await.unwrap(),
        "the probe overwrote the lock"
    );
    assert!(holder.is_acquired().await.unwrap());
    assert_eq!(server.cli(&["TYPE", "__xtr_lock_time_probe__"]), "zset");
}

/// The fencing counter's old name is a resource name like any other: locking it must not turn
/// the counter into a sorted set (which failed every exclusive acquisition on the server).
#[tokio::test]
async fn a_resource_named_like_the_fence_key_is_just_a_resource() {
    let server = RedisServer::start();
    let s = store(&server);
    let odd = lock(&s, "__xtr_lock_fence__", TTL);
    assert!(odd.try_acquire().await.unwrap());
    let t1 = odd.fencing_token().unwrap();
    let plain = lock(&s, "plain", TTL);
    assert!(plain.try_acquire().await.unwrap());
    assert!(plain.fencing_token().unwrap() > t1);
    assert_eq!(odd.release().await.unwrap(), Release::Released);
    assert_eq!(plain.release().await.unwrap(), Release::Released);
}

/// A counter key of the wrong type (written by hand) fails the save before it writes anything:
/// no lock is left behind.
#[tokio::test]
async fn a_failing_fence_leaves_no_lock() {
    let server = RedisServer::start();
    let s = store(&server);
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("LPUSH")
        .arg(s.internal_key("fence"))
        .arg("junk")
        .query_async(&mut conn)
        .await
        .unwrap();
    let l = lock(&s, "victim", TTL);
    let err = l.try_acquire().await.unwrap_err();
    let cause = root(&err);
    assert_eq!(cause.kind(), ErrorKind::Storage, "{cause}");
    assert!(cause.to_string().contains("WRONGTYPE"), "{cause}");
    assert_eq!(server.cli(&["EXISTS", "victim"]), "0", "a lock was left");
    assert!(!l.is_acquired().await.unwrap());
}

/// A restart without persistence loses the counter; tokens still go up.
#[tokio::test]
async fn fencing_tokens_increase_across_a_restart_that_lost_the_counter() {
    let mut server = RedisServer::start();
    let mut last = 0;
    for _ in 0..3 {
        let l = lock(&store(&server), "fenced", TTL);
        assert!(l.try_acquire().await.unwrap());
        last = l.fencing_token().unwrap();
        let _ = l.release().await.unwrap();
    }
    server.restart();
    let s: RedisStore = store(&server);
    assert_eq!(
        s.fencing_counter("fenced").await.unwrap(),
        Some(0),
        "restarted empty"
    );
    let l = lock(&s, "fenced", TTL);
    assert!(l.try_acquire().await.unwrap());
    let after = l.fencing_token().unwrap();
    assert!(
        after > last,
        "token {after} after the restart, {last} before"
    );
}

/// An application's sorted set at a resource's key is not a lock: refused, every member kept
/// (also by a refused or a shared attempt, and by a blocking one, which ends at once).
#[tokio::test]
async fn a_sorted_set_that_is_not_a_lock_is_refused_and_left_untouched() {
    let server = RedisServer::start();
    server.cli(&["ZADD", "leaderboard", "100", "alice", "200", "bob"]);
    let s = store(&server);
    let l = lock(&s, "leaderboard", TTL);
    for attempt in 0..3 {
        let err = match attempt {
            0 => l.try_acquire().await.unwrap_err(),
            1 => l.try_acquire_read().await.unwrap_err(),
            _ => l.acquire().await.unwrap_err(),
        };
        let cause = root(&err);
        assert_eq!(cause.kind(), ErrorKind::Storage, "{cause}");
        assert!(cause.to_string().contains("not a lock"), "{cause}");
        assert!(!err.is_temporary(), "a permanent error: {err}");
    }
    assert_eq!(
        server.cli(&["ZRANGE", "leaderboard", "0", "-1", "WITHSCORES"]),
        "alice\n100\nbob\n200"
    );
    assert!(!l.is_acquired().await.unwrap());
    assert_eq!(l.release().await.unwrap(), Release::NotHeld);
    assert_eq!(server.cli(&["ZCARD", "leaderboard"]), "2");
}

/// During a brief outage a wait with a deadline keeps trying (a temporary error is not the
/// end of it) and gets the lock once the server is back; without a deadline it reports the
/// error at once.
#[tokio::test]
async fn a_wait_with_a_deadline_rides_out_a_brief_outage() {
    let mut server = RedisServer::start();
    let dsn = format!(
        "{}?socket_connect_timeout=0.3&socket_timeout=0.3",
        server.url(0)
    );
    let s = RedisStore::from_dsn(&dsn).unwrap();
    let l = lock(&s, "job", TTL);
    assert!(l.try_acquire().await.unwrap());
    let _ = l.release().await.unwrap();
    server.kill();
    let err = l.acquire().await.unwrap_err();
    assert!(err.is_temporary(), "{err}");
    let waiter =
        tokio::spawn(async move { l.acquire_timeout(std::time::Duration::from_secs(30)).await });
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert!(!waiter.is_finished(), "the wait gave up during the outage");
    server.restart();
    assert!(
        waiter.await.unwrap().unwrap(),
        "acquired once the server was back"
    );
}

/// Durations past the maximum are refused before anything is stored, never a panic.
#[tokio::test]
async fn durations_past_the_maximum_are_refused_before_anything_is_stored() {
    let server = RedisServer::start();
    let s = store(&server);
    let huge = std::time::Duration::MAX;
    let l = lock(&s, "j", huge);
    let err = l.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidTtl, "{err}");
    assert!(err.to_string().contains("at most 3650 days"), "{err}");
    assert_eq!(server.cli(&["EXISTS", "j"]), "0");
    let l = lock(&s, "j", xtr_lock::MAX_DURATION);
    assert!(l.try_acquire().await.unwrap(), "the maximum itself is fine");
    let err = l.refresh(Some(huge)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidTtl, "{err}");
    let other = lock(&s, "j", TTL);
    let err = other.acquire_timeout(huge).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let _ = l.release().await.unwrap();
    // A serialized key with an absurd remaining lifetime is read without overflowing.
    let mut wire: serde_json::Value = serde_json::from_str(&l.key().to_json().unwrap()).unwrap();
    wire["remaining_ms"] = serde_json::json!(u64::MAX);
    let tampered = wire.to_string();
    let key = xtr_lock::Key::from_json(&tampered).unwrap();
    assert!(key.remaining_lifetime().unwrap() <= xtr_lock::MAX_DURATION);
}

/// A DSN pointed at a server of another protocol (a Redis DSN at a Memcached, which answers
/// `ERROR`; a Memcached DSN at a Redis): one line saying so and naming the address, for both
/// Redis stores and the Memcached store; not the parser's dump of the bytes it could not read.
#[tokio::test]
async fn a_server_of_another_protocol_is_said_in_one_line() {
    let memcached = xtr_lock_testkit::memcached::MemcachedServer::start();
    let redis = RedisServer::start();
    let at_memcached = format!("127.0.0.1:{}", memcached.port());
    let at_redis = format!("127.0.0.1:{}", redis.port());
    for (dsn, address, protocol) in [
        (format!("redis://{at_memcached}/0"), &at_memcached, "Redis"),
        (
            format!("redis+pubsub://{at_memcached}/0"),
            &at_memcached,
            "Redis",
        ),
        (format!("memcached://{at_redis}"), &at_redis, "Memcached"),
    ] {
        let store = xtr_lock::StoreFactory::create_store(&dsn).unwrap();
        let lock = xtr_lock::LockFactory::from_arc(store).create_lock("not-redis");
        let err = lock.try_acquire().await.unwrap_err();
        let said = xtr_lock::Report::new(&err).to_string();
        assert!(!said.contains('\n'), "{dsn}: {said}");
        let expected = format!("does not speak the {protocol} protocol");
        assert!(said.contains(&expected), "{dsn}: {said}");
        assert!(said.contains(address.as_str()), "{dsn}: {said}");
        assert!(!said.contains("Unexpected"), "{dsn}: {said}");
    }
}
