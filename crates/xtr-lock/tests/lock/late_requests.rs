//! A request that saves a lock, held back by a proxy past the store's request timeout: the
//! acquire fails, then the late save lands. Its clean-up must follow it, not run before it and
//! find nothing: once the late save has landed, the lock is soon free again (issue 30). On
//! Memcached (the `ms … ME` add, `?timeout=0.5`) and the SQL table store on PostgreSQL and
//! MariaDB (the INSERT's execution, `?statement_timeout=0.5`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xtr_lock::store::{CombinedStore, ConsensusStrategy};
use xtr_lock::{InMemoryStore, LockFactory, Lockable as _, MemcachedStore, SqlStore, Store};
use xtr_lock_testkit::hook_proxy::HeldRequest;
use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::postgres::PostgresServer;

const TTL: Option<Duration> = Some(Duration::from_secs(30));
/// How long the proxy holds the save back: past the request timeout (0.5 s), within the
/// landing bound of one more timeout.
const HELD: Duration = Duration::from_millis(800);
/// A bound on anything expected to happen "at once" on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(10);

fn resource(name: &str) -> String {
    format!("late-{name}-{:08x}", rand::random::<u32>())
}

/// Acquires `r` through `proxied` (whose save the proxy holds back), expects the acquire to
/// fail, waits for the late save to land, then checks through `direct` that the lock is not
/// left held: the store lists nobody, and another holder's `try_acquire` succeeds.
async fn a_save_that_lands_after_the_timeout_leaves_nothing_held(
    proxied: Arc<dyn Store>,
    direct: Arc<dyn Store>,
    held: HeldRequest,
    r: &str,
) {
    let lock = LockFactory::from_arc(proxied).with_ttl(TTL).create_lock(r);
    let tried = tokio::time::timeout(PATIENCE, lock.try_acquire())
        .await
        .expect("the request timeout bounds the acquire");
    assert!(held.arrived().is_some(), "the proxy saw the save");
    let err = tried.expect_err("the save was held past the request timeout: the acquire fails");
    eprintln!("the acquire failed: {err}");
    nothing_held_once_it_lands(direct, held, r).await;
    drop(lock);
}

/// Waits for the held save to land, then checks through `direct` that the lock is soon free:
/// the store lists nobody, and another holder's `try_acquire` succeeds.
async fn nothing_held_once_it_lands(direct: Arc<dyn Store>, held: HeldRequest, r: &str) {
    let watch = held.clone();
    let landed = tokio::task::spawn_blocking(move || watch.wait_landed(HELD + PATIENCE))
        .await
        .unwrap();
    let deadline = landed + PATIENCE;
    loop {
        let holders = direct.holders(r).await.unwrap();
        if holders.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the late save landed and stayed: the store lists {holders:?} {:?} after it landed, \
             though the acquire failed and nobody holds the lock",
            landed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let other = LockFactory::from_arc(direct).with_ttl(TTL).create_lock(r);
    assert!(
        other.try_acquire().await.unwrap(),
        "another holder gets the lock the failed acquire left"
    );
    let _ = other.release().await.unwrap();
}

/// Holds back the execution of the lock row's INSERT: the next chunk the client sends on the
/// connection that prepared it (the sqlx drivers prepare a statement in one round trip and
/// execute it in the next).
fn hold_the_insert(port: u16) -> (u16, HeldRequest) {
    let prepared_on = Mutex::new(None);
    HeldRequest::start(port, HELD, move |n, chunk| {
        let mut on = prepared_on.lock().unwrap();
        if *on == Some(n) {
            return true;
        }
        if on.is_none() && chunk.windows(11).any(|w| w == b"INSERT INTO") {
            *on = Some(n);
        }
        false
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_an_add_that_lands_after_the_timeout_leaves_nothing_held() {
    let server = MemcachedServer::start();
    let (port, held) = HeldRequest::start(server.port(), HELD, |_, chunk| {
        chunk.starts_with(b"ms ") && chunk.windows(3).any(|w| w == b" ME")
    });
    let proxied =
        MemcachedStore::from_dsn(&format!("memcached://127.0.0.1:{port}?timeout=0.5")).unwrap();
    let direct = MemcachedStore::from_dsn(&server.url()).unwrap();
    let r = resource("memcached");
    a_save_that_lands_after_the_timeout_leaves_nothing_held(
        Arc::new(proxied),
        Arc::new(direct),
        held,
        &r,
    )
    .await;
}

/// The SQL table store on `url` (a testkit server's), directly and through a proxy on `port`
/// holding back the INSERT; the table is made first, directly.
async fn sql_stores(url: &str, server_port: u16) -> (Arc<dyn Store>, Arc<dyn Store>, HeldRequest) {
    let direct = SqlStore::from_dsn(&format!("{url}?create_table=true")).unwrap();
    direct.create_table().await.unwrap();
    let (port, held) = hold_the_insert(server_port);
    let through = url.replacen(
        &format!("127.0.0.1:{server_port}"),
        &format!("127.0.0.1:{port}"),
        1,
    );
    assert_ne!(
        through, url,
        "the proxy's port replaces the server's in {url}"
    );
    let proxied = SqlStore::from_dsn(&format!("{through}?statement_timeout=0.5")).unwrap();
    (Arc::new(proxied), Arc::new(direct), held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_insert_that_lands_after_the_timeout_leaves_nothing_held() {
    let server = PostgresServer::start();
    let (proxied, direct, held) = sql_stores(&server.url(), server.port()).await;
    let r = resource("postgres");
    a_save_that_lands_after_the_timeout_leaves_nothing_held(proxied, direct, held, &r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_an_insert_that_lands_after_the_timeout_leaves_nothing_held() {
    let server = MariaDbServer::start();
    let (proxied, direct, held) = sql_stores(&server.url(), server.port()).await;
    let r = resource("mariadb");
    a_save_that_lands_after_the_timeout_leaves_nothing_held(proxied, direct, held, &r).await;
}

/// A quorum member's save given up on at the member's own timeout, while the quorum decided
/// without it (the other members refused at once): its roll-back delete must follow the late
/// save on that member, not run before it and find nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_members_add_that_lands_after_its_timeout_leaves_nothing_held() {
    let server = MemcachedServer::start();
    let (port, held) = HeldRequest::start(server.port(), HELD, |_, chunk| {
        chunk.starts_with(b"ms ") && chunk.windows(3).any(|w| w == b" ME")
    });
    let proxied: Arc<dyn Store> = Arc::new(
        MemcachedStore::from_dsn(&format!("memcached://127.0.0.1:{port}?timeout=0.5")).unwrap(),
    );
    let direct: Arc<dyn Store> = Arc::new(MemcachedStore::from_dsn(&server.url()).unwrap());
    let (m1, m2): (Arc<dyn Store>, Arc<dyn Store>) = (
        Arc::new(InMemoryStore::new()),
        Arc::new(InMemoryStore::new()),
    );
    let r = resource("quorum");
    // Another holder holds on the two in-memory members: the quorum refuses at once.
    for member in [&m1, &m2] {
        let other = LockFactory::from_arc(member.clone())
            .with_ttl(TTL)
            .create_lock(&r);
        assert!(other.try_acquire().await.unwrap());
    }
    let quorum: Arc<dyn Store> =
        Arc::new(CombinedStore::new(vec![proxied, m1, m2], ConsensusStrategy).unwrap());
    let lock = LockFactory::from_arc(quorum).with_ttl(TTL).create_lock(&r);
    let tried = tokio::time::timeout(PATIENCE, lock.try_acquire())
        .await
        .expect("the quorum answers");
    assert!(!matches!(tried, Ok(true)), "refused: {tried:?}");
    assert_eq!(lock.held_mode(), None);
    nothing_held_once_it_lands(direct, held, &r).await;
}
