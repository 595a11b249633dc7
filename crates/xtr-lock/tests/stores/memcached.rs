//! The Memcached store against real PHP processes on Symfony's `MemcachedStore` over
//! php-memcached (`tests/peers/symfony_holder.php`), both ways; its release, which never deletes a lock
//! that changed hands; eviction and the limits it refuses.

use std::time::{Duration, Instant};

use std::io::{Read as _, Write as _};
use xtr_lock::{ErrorKind, LockFactory, Lockable as _, MemcachedStore, Release};
use xtr_lock_testkit::hook_proxy;
use xtr_lock_testkit::memcached::MemcachedServer;

use crate::support::symfony_sql::Holder;

/// A Symfony `MemcachedStore` trying `resource` once is refused (the lock is held).
pub(super) async fn php_is_refused(server: &MemcachedServer, resource: &str) {
    let args = ["--try", "--ttl=30"];
    let mut busy = Holder::start_on(&server.url(), resource, "write", 0.0, &args);
    busy.until("BUSY").await;
    assert_eq!(busy.exit_code().await, 1);
}

fn rust(server: &MemcachedServer) -> LockFactory {
    LockFactory::new(MemcachedStore::from_dsn(&server.url()).unwrap())
        .with_ttl(Some(Duration::from_secs(30)))
}

#[tokio::test]
async fn a_php_holder_excludes_rust_and_a_rust_waiter_gets_it_after_the_php_release() {
    let server = MemcachedServer::start();
    let resource = "invoice:php-holds";
    let mut php = Holder::start_on(&server.url(), resource, "write", 60.0, &["--ttl=30"]);
    php.until("ACQUIRED").await;
    let token = php.until("TOKEN").await;
    assert_eq!(
        server.get(resource).as_deref(),
        Some(token.get("token")),
        "Symfony's layout: the key is the resource, the value the token"
    );
    let lock = rust(&server).create_lock(resource);
    assert!(!lock.try_acquire().await.unwrap());
    let holders = lock.store().holders(resource).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert!(holders[0].remaining.unwrap() <= Duration::from_secs(30));
    let waiter = lock.clone();
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    php.term();
    php.until("RELEASED").await;
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter polls and gets the lock after Symfony's release")
        .unwrap()
        .unwrap();
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert_eq!(server.get(resource), None);
}

#[tokio::test]
async fn a_rust_holder_excludes_php_and_a_php_waiter_gets_it_after_the_rust_release() {
    let server = MemcachedServer::start();
    let resource = "invoice:rust-holds";
    let lock = rust(&server).create_lock(resource);
    assert!(lock.try_acquire().await.unwrap());
    php_is_refused(&server, resource).await;
    // Symfony's MemcachedStore has no blocking wait: the holder script polls every 100 ms.
    let mut waiter = Holder::start_on(
        &server.url(),
        resource,
        "write",
        0.2,
        &["--timeout=20", "--ttl=30"],
    );
    waiter.until("WAITING").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(waiter.seen.iter().all(|e| e.event != "ACQUIRED"));
    let released = Instant::now();
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    waiter.until("ACQUIRED").await;
    eprintln!(
        "Symfony waiter got it {:?} after the Rust release",
        released.elapsed()
    );
    waiter.until("RELEASED").await;
    assert_eq!(waiter.exit_code().await, 0);
    assert!(lock.try_acquire().await.unwrap());
    let _ = lock.release().await.unwrap();
}

#[tokio::test]
async fn a_killed_php_holder_is_freed_at_its_ttl_and_not_before() {
    let server = MemcachedServer::start();
    let resource = "invoice:php-killed";
    let mut php = Holder::start_on(&server.url(), resource, "write", 60.0, &["--ttl=3"]);
    php.until("ACQUIRED").await;
    let taken = Instant::now();
    drop(php); // SIGKILL: nothing releases; the entry lives out its 3 s.
    let lock = rust(&server).create_lock(resource);
    assert!(!lock.try_acquire().await.unwrap());
    assert!(lock.acquire_timeout(Duration::from_secs(10)).await.unwrap());
    let after = taken.elapsed();
    // Memcached's clock ticks in whole seconds: the entry ends 2 to 3 s after it was stored.
    assert!(
        after >= Duration::from_millis(1900),
        "freed after {after:?}"
    );
    let _ = lock.release().await.unwrap();
}

/// Just before a conditional delete (`md`) goes through, the entry changes hands: another
/// holder's token is stored, as if the lock had expired and been taken in the gap between the
/// release's read and its delete.
fn hand_the_lock_over(port: u16, resource: &str, chunk: &[u8]) {
    if !chunk.starts_with(b"md ") {
        return;
    }
    let mut other = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let set = format!("ms {resource} 9 T30 F0\r\nsomeone-2\r\n");
    other.write_all(set.as_bytes()).unwrap();
    let mut reply = [0u8; 16];
    let r = other.read(&mut reply).unwrap();
    assert_eq!(&reply[..r], b"HD\r\n");
}

#[tokio::test]
async fn a_release_never_deletes_a_lock_that_changed_hands_after_its_read() {
    let server = MemcachedServer::start();
    let resource = "invoice:race";
    let target = server.port();
    let port = hook_proxy::start(target, move |_, chunk| {
        hand_the_lock_over(target, resource, chunk)
    });
    let store = MemcachedStore::from_dsn(&format!("memcached://127.0.0.1:{port}")).unwrap();
    let lock = LockFactory::new(store)
        .with_ttl(Some(Duration::from_secs(30)))
        .create_lock(resource);
    assert!(lock.try_acquire().await.unwrap());
    // The release reads our entry, the entry changes hands, the conditional delete is refused.
    assert_eq!(lock.release().await.unwrap(), Release::Lost);
    assert_eq!(
        server.get(resource).as_deref(),
        Some("someone-2"),
        "the new holder's lock is still there (Symfony's unconditional delete would remove it)"
    );
}

#[tokio::test]
async fn an_evicted_lock_is_reported_lost_at_the_next_refresh() {
    // 2 MB (the least memcached takes): filling the slab class of the lock's entry evicts it (least recently used).
    let server = MemcachedServer::start_with(&["-m", "2"]);
    let resource = "invoice:evicted";
    let lock = rust(&server).create_lock(resource);
    assert!(lock.try_acquire().await.unwrap());
    // Fill over one connection, 1000 quiet stores (`q`: no reply unless an error) at a time.
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    let value = "x".repeat(44);
    // 100,000 entries of about 100 bytes: five times the memory. Reading the lock's entry in
    // between would keep it recently used, so it is read only at the end.
    for batch in 0..100 {
        let mut out = String::new();
        for i in 0..1000 {
            out.push_str(&format!("ms filler:{batch}:{i} 44 T0 q\r\n{value}\r\n"));
        }
        out.push_str("mn\r\n");
        std::io::Write::write_all(&mut conn, out.as_bytes()).unwrap();
        let mut reply = [0u8; 4];
        std::io::Read::read_exact(&mut conn, &mut reply).unwrap();
        assert_eq!(&reply, b"MN\r\n", "a quiet store failed");
    }
    assert_eq!(server.get(resource), None, "the lock's entry was evicted");
    assert!(server.stat("evictions") > 0);
    let err = lock.refresh(None).await.unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert!(!lock.is_acquired().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Lost);
}

#[tokio::test]
async fn names_and_ttls_memcached_cannot_keep_are_refused_up_front() {
    let server = MemcachedServer::start();
    let f = rust(&server);
    for name in ["has space", "", &"n".repeat(251), "tab\there"] {
        let err = f.create_lock(name).try_acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name:?}: {err}");
        assert!(err.to_string().contains("250 bytes"), "{err}");
    }
    assert!(f.create_lock("n".repeat(250)).try_acquire().await.unwrap());
    let long = f
        .create_lock("ttl:long")
        .with_ttl(Some(Duration::from_secs(31 * 24 * 3600)));
    let err = long.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("30 days"), "{err}");
    let short = f
        .create_lock("ttl:short")
        .with_ttl(Some(Duration::from_secs(1)));
    let err = short.try_acquire().await.unwrap_err();
    assert!(err.to_string().contains("at least 2 s"), "{err}");
    assert_eq!(server.get("ttl:long"), None);
    assert_eq!(server.get("ttl:short"), None);
}

#[tokio::test]
async fn a_paused_server_is_a_temporary_error_within_the_timeout_never_a_hang() {
    let server = MemcachedServer::start();
    let store = MemcachedStore::from_dsn(&format!("{}?timeout=0.5", server.url())).unwrap();
    let lock = LockFactory::new(store)
        .with_ttl(Some(Duration::from_secs(30)))
        .create_lock("invoice:paused");
    assert!(lock.try_acquire().await.unwrap());
    server.pause();
    let err = tokio::time::timeout(Duration::from_secs(10), lock.refresh(None))
        .await
        .expect("bounded by the response timeout")
        .unwrap_err();
    assert!(err.is_temporary(), "{err}");
    server.resume();
    lock.refresh(None).await.unwrap();
    assert_eq!(lock.release().await.unwrap(), Release::Released);
}

/// Acquires and releases dropped at random points (within the round trips): once the dropped
/// locks have cleaned up, no entry is left and the resource is free. (Before each holder's
/// requests ran in order, a clean-up delete could overtake the dropped add on another
/// connection and leave the entry for its whole ttl: seen here about once in six runs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_and_releases_dropped_at_random_points_leave_nothing_held() {
    use rand::Rng as _;
    let server = MemcachedServer::start();
    let f = rust(&server);
    let resource = "invoice:cancel";
    for round in 0..300 {
        let cut = Duration::from_micros(rand::rng().random_range(0..1500));
        let lock = f.create_lock(resource);
        if let Ok(done) = tokio::time::timeout(cut, lock.acquire()).await {
            done.unwrap();
            let cut = Duration::from_micros(rand::rng().random_range(0..1500));
            let _ = tokio::time::timeout(cut, lock.release()).await;
        }
        drop(lock);
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.get(resource).is_some() {
            assert!(
                Instant::now() < deadline,
                "round {round}: an entry was left held"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let lock = f.create_lock(resource);
    assert!(lock.try_acquire().await.unwrap());
    let _ = lock.release().await.unwrap();
}

/// After a server restart, the pooled connections are closed: the next operation is sent again
/// on a new connection instead of failing (the restart lost the lock, which the holder is told).
#[tokio::test]
async fn a_restarted_server_costs_no_error_for_the_pooled_connections() {
    let mut server = MemcachedServer::start();
    let f = rust(&server);
    let held = f.create_lock("invoice:restart-held");
    assert!(held.try_acquire().await.unwrap());
    server.restart();
    let lock = f.create_lock("invoice:restart");
    assert!(
        lock.try_acquire().await.unwrap(),
        "a new connection, no error"
    );
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    let err = held.refresh(None).await.unwrap_err();
    assert!(err.is_lost(), "the restart lost the lock: {err}");
}

/// The regression for the order of a holder's requests: an acquire dropped while its add is on
/// the way, and the lock's clean-up delete sent on another connection, which arrives first.
#[tokio::test]
async fn a_dropped_acquire_is_taken_back_even_when_its_add_lands_after_the_clean_up_starts() {
    let server = MemcachedServer::start();
    // The first connection delivers the client's bytes 300 ms late; the ones after it go
    // straight through, so a request on it is overtaken by any request on another connection.
    let port = hook_proxy::start(server.port(), |n, _| {
        if n == 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let store = MemcachedStore::from_dsn(&format!("memcached://127.0.0.1:{port}")).unwrap();
    let lock = LockFactory::new(store)
        .with_ttl(Some(Duration::from_secs(30)))
        .create_lock("invoice:overtaken");
    // The first connection checks the version (slowly); the add goes out on it too.
    let dropped = tokio::time::timeout(Duration::from_millis(450), lock.try_acquire()).await;
    assert!(dropped.is_err(), "the acquire was still under way");
    drop(lock);
    // The add lands (the server counts it), then the entry must go: an add that landed after
    // the clean-up would stay for its 30 s.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stat("total_items") == 0 {
        assert!(Instant::now() < deadline, "the delayed add never landed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    while server.get("invoice:overtaken").is_some() {
        assert!(
            Instant::now() < deadline,
            "the add landed after the clean-up and stayed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
