//! The advisory store in Symfony's key mode against real PHP processes on Symfony's
//! `PostgreSqlStore` (`tests/peers/symfony_holder.php`), both ways, on a server the testkit starts.

use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, PgAdvisoryStore, Release};
use xtr_lock_testkit::postgres::PostgresServer;

use crate::support::symfony_sql::Holder;

fn rust(server: &PostgresServer, options: &str) -> LockFactory {
    let url = server.url();
    let dsn = format!(
        "postgresql+advisory{}{options}",
        url.strip_prefix("postgres").unwrap()
    );
    LockFactory::new(PgAdvisoryStore::from_dsn(&dsn).unwrap())
}

fn symfony(server: &PostgresServer) -> String {
    format!(
        "pgsql+advisory:host=127.0.0.1;port={};dbname=postgres;user=postgres;sslmode=disable",
        server.port()
    )
}

#[tokio::test]
async fn a_symfony_writer_excludes_rust_in_crc32_mode_only() {
    let server = PostgresServer::start();
    let crc = rust(&server, "?keys=crc32");
    let sha = rust(&server, "");
    let resource = "peer:write";
    let mut php = Holder::start_on(&symfony(&server), resource, "write", 60.0, &["--ttl=0"]);
    let info = php.until("INFO").await;
    assert_eq!(
        info.get("pg_advisory_bigint"),
        PgAdvisoryStore::from_dsn("postgresql+advisory://h/db?keys=crc32")
            .unwrap()
            .advisory_key(resource)
            .to_string()
    );
    php.until("ACQUIRED").await;
    let lock = crc.create_lock(resource);
    assert!(!lock.try_acquire().await.unwrap());
    assert!(!lock.try_acquire_read().await.unwrap());
    let other_space = sha.create_lock(resource);
    assert!(
        other_space.try_acquire().await.unwrap(),
        "the 64-bit keys are another key space"
    );
    let _ = other_space.release().await.unwrap();
    let holders = crc.store().holders(resource).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    php.term();
    php.until("RELEASED").await;
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Released);
}

#[tokio::test]
async fn a_rust_writer_makes_symfony_busy_and_a_blocked_symfony_waiter_wakes_on_release() {
    let server = PostgresServer::start();
    let crc = rust(&server, "?keys=crc32");
    let resource = "peer:rust-writes";
    let lock = crc.create_lock(resource);
    assert!(lock.try_acquire().await.unwrap());
    let php = Holder::start_on(
        &symfony(&server),
        resource,
        "write",
        0.0,
        &["--try", "--ttl=0"],
    );
    let mut php = php;
    php.until("BUSY").await;
    assert_eq!(php.exit_code().await, 1);
    let php_read = Holder::start_on(
        &symfony(&server),
        resource,
        "read",
        0.0,
        &["--try", "--ttl=0"],
    );
    let mut php_read = php_read;
    php_read.until("BUSY").await;
    // Symfony's native blocking wait (pg_advisory_lock), woken by the Rust release.
    let mut waiter = Holder::start_on(&symfony(&server), resource, "write", 0.2, &["--ttl=0"]);
    waiter.until("WAITING").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(waiter.seen.iter().all(|e| e.event != "ACQUIRED"));
    let released = Instant::now();
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    waiter.until("ACQUIRED").await;
    eprintln!(
        "Symfony waiter woken {:?} after the Rust release",
        released.elapsed()
    );
    waiter.until("RELEASED").await;
}

#[tokio::test]
async fn readers_share_across_languages_and_a_rust_writer_waits_for_the_php_reader() {
    let server = PostgresServer::start();
    let crc = rust(&server, "?keys=crc32");
    let resource = "peer:readers";
    let reader = crc.create_lock(resource);
    assert!(reader.try_acquire_read().await.unwrap());
    let mut php = Holder::start_on(
        &symfony(&server),
        resource,
        "read",
        60.0,
        &["--try", "--ttl=0"],
    );
    php.until("ACQUIRED").await;
    assert_eq!(reader.release().await.unwrap(), Release::Released);
    // A Rust writer waits natively for the PHP reader, and holds the moment it goes.
    let writer = crc.create_lock(resource);
    assert!(!writer.try_acquire().await.unwrap());
    let w = writer.clone();
    let waiting = tokio::spawn(async move { w.acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the writer waits for the PHP reader"
    );
    php.term();
    php.until("RELEASED").await;
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the writer gets the lock once the reader left")
        .unwrap()
        .unwrap();
    let mut php_writer = Holder::start_on(
        &symfony(&server),
        resource,
        "write",
        0.0,
        &["--try", "--ttl=0"],
    );
    php_writer.until("BUSY").await;
    let _ = writer.release().await.unwrap();
}

#[tokio::test]
async fn a_killed_php_holder_frees_the_lock_at_once() {
    let server = PostgresServer::start();
    let crc = rust(&server, "?keys=crc32");
    let resource = "invoice:29685295";
    let mut php = Holder::start_on(&symfony(&server), resource, "write", 60.0, &["--ttl=0"]);
    php.until("ACQUIRED").await;
    // The crc32 collision: another resource, the same key.
    let colliding = crc.create_lock("invoice:32060020");
    assert!(!colliding.try_acquire().await.unwrap());
    let w = colliding.clone();
    let waiting = tokio::spawn(async move { w.acquire().await });
    drop(php); // SIGKILL: the session ends with the process.
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the session's end frees the lock")
        .unwrap()
        .unwrap();
    let _ = colliding.release().await.unwrap();
}
