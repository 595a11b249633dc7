//! RedisStore connections, against real throwaway servers: ACL users and unix sockets, a client
//! you built, TLS, a second runtime, `close`, and requests that share a failed connection
//! attempt instead of queueing behind it.

use std::time::{Duration, Instant};

use xtr_lock::{ErrorKind, Key, Lockable as _, RedisStore, Store};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, lock, store};

#[tokio::test]
async fn acl_users_and_unix_sockets_connect() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    server.cli(&[
        "-a",
        "s3cret",
        "--no-auth-warning",
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">p@ss",
        "~*",
        "&*",
        "+@all",
    ]);
    let store = RedisStore::from_dsn(&format!(
        "redis://locker:p%40ss@127.0.0.1:{}/0",
        server.port()
    ))
    .unwrap();
    assert!(lock(&store, "acl", TTL).try_acquire().await.unwrap());
    let wrong = RedisStore::from_dsn(&format!(
        "redis://locker:nope@127.0.0.1:{}/0",
        server.port()
    ))
    .unwrap();
    let err = wrong.save(&Key::new("acl"), Some(TTL)).await.unwrap_err();
    assert!(!format!("{err:?}").contains("nope"));
    // The refusal in words, once (the client says "Password authentication failed -
    // AuthenticationFailed"), and so is a password the server wants and the DSN lacks.
    assert!(
        format!("{err:?}").contains("the Redis server refused the DSN's credentials"),
        "{err:?}"
    );
    let none = RedisStore::from_dsn(&format!("redis://127.0.0.1:{}/0", server.port())).unwrap();
    let err = none.save(&Key::new("acl"), Some(TTL)).await.unwrap_err();
    assert!(
        format!("{err:?}").contains("the Redis server requires a password, and the DSN gives none"),
        "{err:?}"
    );
    assert!(!format!("{err:?}").contains("NOAUTH"), "{err:?}");
    let unix = RedisStore::from_dsn(&format!(
        "unix://:s3cret@{}?db=1",
        server.socket_path().display()
    ))
    .unwrap();
    assert!(lock(&unix, "sock", TTL).try_acquire().await.unwrap());
}

#[tokio::test]
async fn a_store_over_a_client_you_built() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url(0)).unwrap();
    let store = RedisStore::from_client(client).with_prefix("mine:");
    assert_eq!(
        store.to_string(),
        format!("redis://127.0.0.1:{}/0", server.port())
    );
    let l = lock(&store, "r", TTL);
    assert!(l.try_acquire().await.unwrap());
    assert_eq!(server.cli(&["TYPE", "mine:r"]), "zset");
    let _ = l.release().await.unwrap();
}

#[tokio::test]
async fn rediss_connects_over_tls_and_checks_the_certificate() {
    let server = RedisServer::start_tls();
    let port = server.tls_port().unwrap();
    // A self-signed certificate: trusted only when told to skip verification.
    let insecure = RedisStore::from_dsn(&format!("rediss://127.0.0.1:{port}/0#insecure")).unwrap();
    assert_eq!(insecure.to_string(), format!("rediss://127.0.0.1:{port}/0"));
    let l = lock(&insecure, "tls", TTL);
    assert!(l.try_acquire().await.unwrap());
    assert_eq!(
        server.cli(&["TYPE", "tls"]),
        "zset",
        "the same server, reached over TLS"
    );
    let _ = l.release().await.unwrap();
    let verified = RedisStore::from_dsn(&format!(
        "rediss://127.0.0.1:{port}/0?socket_connect_timeout=2"
    ))
    .unwrap();
    let err = verified
        .save(&Key::new("tls"), Some(TTL))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Storage, "{err:?}");
}

#[test]
fn a_store_keeps_working_on_a_second_runtime() {
    let server = RedisServer::start();
    let store = store(&server);
    let lock = lock(&store, "runtimes", TTL);
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert!(first.block_on(lock.try_acquire()).unwrap());
    drop(first); // the connection's driver task dies with it
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        assert!(
            lock.is_acquired().await.unwrap(),
            "no error on the new runtime"
        );
        let _ = lock.release().await.unwrap();
    });
}

/// The clients connected to `server`, not counting the `redis-cli` that asks.
fn our_connections(server: &RedisServer) -> usize {
    let info = server.cli(&["INFO", "clients"]);
    let n: usize = info
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO clients has connected_clients");
    n - 1
}

async fn until_connections(server: &RedisServer, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while our_connections(server) != n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} connections, not {n}",
            our_connections(server)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn close_drops_both_connections_and_waiters_and_later_calls_carry_on() {
    let server = RedisServer::start();
    let store = store(&server);
    let holder = lock(&store, "r", TTL);
    assert!(holder.try_acquire().await.unwrap());
    let waiter = lock(&store, "r", TTL);
    let waiting = tokio::spawn(async move {
        waiter.acquire().await.unwrap();
        let _ = waiter.release().await.unwrap();
    });
    until_connections(&server, 2, "commands + the waiter's subscription").await;

    store.close().await.unwrap();
    // The waiter goes on: it polls, then subscribes again on a new connection.
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter still gets the lock after close")
        .unwrap();
    store.close().await.unwrap();
    until_connections(&server, 0, "after close").await;

    // A closed store reconnects on its next call.
    assert!(holder.try_acquire().await.unwrap());
    until_connections(&server, 1, "reconnected").await;
    let _ = holder.release().await.unwrap();
}

#[tokio::test]
async fn requests_waiting_for_a_failed_connection_share_its_error_instead_of_queueing() {
    let server = RedisServer::start();
    server.pause(); // accepts TCP connections, never answers the handshake
    let store =
        RedisStore::from_dsn(&format!("{}?socket_connect_timeout=1", server.url(0))).unwrap();
    let started = Instant::now();
    let attempts: Vec<_> = (0..4)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.save(&Key::new(format!("r{i}")), Some(TTL)).await })
        })
        .collect();
    for attempt in attempts {
        let err = attempt.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Storage, "{err}");
        assert!(err.is_temporary(), "{err}");
        assert!(err.to_string().contains("cannot connect"), "{err}");
    }
    // One attempt of at most the connect timeout for all four; queued one after another they
    // would take four.
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(2500), "{elapsed:?}");
    server.resume();
    // Once the pause after a failure is over, the store connects again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lock = lock(&store, "r0", TTL);
    assert!(lock.try_acquire().await.unwrap());
    let _ = lock.release().await.unwrap();
}
