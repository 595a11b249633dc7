//! Every call of the table stores and of Memcached returns within its bound when the server is
//! cut off (a proxy that freezes), paused (SIGSTOP) or killed: a renewal, a check, a new
//! attempt, a release, and `close`. Plus the smaller faults of the SQL store: which MySQL errors
//! are worth retrying, and an SQLite release that must not make a database file.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::{Key, LockFactory, Lockable as _, MemcachedStore, Mode, SqlStore, Store, Wait};
use xtr_lock_testkit::hook_proxy::Freezer;
use xtr_lock_testkit::memcached::MemcachedServer;

use crate::support::symfony_sql::Db;

const TTL: Option<Duration> = Some(Duration::from_secs(30));

/// The stores' connect and statement timeouts in these tests.
const BOUND: &str = "1";

/// The longest any one call may take: the 1 s bound, with room for a loaded machine.
const LIMIT: Duration = Duration::from_secs(4);

fn unique(name: &str) -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    format!("bounded:{name}:{:08x}", u32::from_le_bytes(b))
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    Freeze,
    Pause,
    Kill,
}

/// Runs `call`, failing unless it returns within [`LIMIT`] (given up on after 30 s).
async fn timed<T>(what: &str, fault: Fault, call: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .unwrap_or_else(|_| panic!("{fault:?}: {what} had not returned after 30 s"));
    let took = started.elapsed();
    assert!(took < LIMIT, "{fault:?}: {what} took {took:?}");
    out
}

/// Takes a lock, lets `fault` strike, then times every kind of call.
async fn every_call_is_bounded(store: Arc<dyn Store>, fault: Fault, strike: impl FnOnce()) {
    let held = Key::new(unique("held"));
    assert!(store.save(&held, TTL).await.unwrap().is_acquired());
    strike();
    let renewed = timed(
        "a renewal",
        fault,
        store.put_off_expiration(&held, Duration::from_secs(30)),
    )
    .await;
    assert!(renewed.is_err(), "{fault:?}: renewed: {renewed:?}");
    let _ = timed("a check", fault, store.exists(&held)).await;
    let other = Key::new(unique("other"));
    let saved = timed("a new attempt", fault, store.save(&other, TTL)).await;
    assert!(saved.is_err(), "{fault:?}: saved: {saved:?}");
    let _ = timed("a release", fault, store.delete(&held)).await;
    timed("close", fault, store.close()).await.unwrap();
}

fn sql_dsn(url: &str, port: u16, proxy: u16) -> String {
    let url = url.replace(&format!(":{port}/"), &format!(":{proxy}/"));
    format!("{url}?create_table=true&connect_timeout={BOUND}&statement_timeout={BOUND}")
}

async fn sql_calls_are_bounded(mut db: Db, fault: Fault) {
    let (proxy, freezer) = Freezer::start(db.port());
    let dsn = sql_dsn(&db.url(), db.port(), proxy);
    let store: Arc<dyn Store> = Arc::new(SqlStore::from_dsn(&dsn).unwrap());
    let paused = matches!(fault, Fault::Pause);
    every_call_is_bounded(store, fault, || match fault {
        Fault::Freeze => freezer.freeze(),
        Fault::Pause => db.pause(),
        Fault::Kill => db.kill(),
    })
    .await;
    freezer.thaw();
    if paused {
        db.resume();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_calls_are_bounded_behind_a_frozen_proxy() {
    sql_calls_are_bounded(Db::postgres(), Fault::Freeze).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_calls_are_bounded_on_a_paused_server() {
    sql_calls_are_bounded(Db::postgres(), Fault::Pause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_calls_are_bounded_on_a_killed_server() {
    sql_calls_are_bounded(Db::postgres(), Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_calls_are_bounded_behind_a_frozen_proxy() {
    sql_calls_are_bounded(Db::mariadb(), Fault::Freeze).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_calls_are_bounded_on_a_paused_server() {
    sql_calls_are_bounded(Db::mariadb(), Fault::Pause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_calls_are_bounded_on_a_killed_server() {
    sql_calls_are_bounded(Db::mariadb(), Fault::Kill).await;
}

/// A wait that gives up on a database that is down or paused leaves nothing running: the
/// connection it was still opening (its connect timeout is longer) is abandoned with it, so the
/// process has nothing left to settle and the store closes at once (`xtr-lock run -w` can exit
/// at its wait).
async fn a_wait_that_gives_up_leaves_nothing_running(mut db: Db, fault: Fault) {
    let dsn = format!("{}?connect_timeout=10", db.url());
    let store = SqlStore::from_dsn(&dsn).unwrap();
    match fault {
        Fault::Kill => db.kill(),
        _ => db.pause(),
    }
    let started = Instant::now();
    let lock = LockFactory::new(store.clone())
        .with_ttl(TTL)
        .create_lock(unique("wait"));
    let got = lock
        .acquire_with(Mode::Write, Wait::AtMost(Duration::from_secs(2)))
        .await;
    assert!(!matches!(got, Ok(true)), "{fault:?}: {got:?}");
    assert!(xtr_lock::settle(Duration::from_secs(30)).await);
    timed("close", fault, store.close()).await.unwrap();
    let took = started.elapsed();
    if matches!(fault, Fault::Pause) {
        db.resume();
    }
    assert!(
        took < Duration::from_secs(5),
        "{fault:?}: a 2 s wait left work running for {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_wait_on_a_killed_server_leaves_nothing_running() {
    a_wait_that_gives_up_leaves_nothing_running(Db::postgres(), Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_wait_on_a_paused_server_leaves_nothing_running() {
    a_wait_that_gives_up_leaves_nothing_running(Db::mariadb(), Fault::Pause).await;
}

/// A call that reaches its statement timeout while still waiting for a connection (the connect
/// timeout is longer) stops waiting then: nothing was sent, so nothing is left to land, and
/// nothing is left for the process to settle (`xtr-lock run` exits at the timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_call_timed_out_before_connecting_leaves_nothing_running() {
    let mut db = Db::postgres();
    let dsn = format!("{}?connect_timeout=10&statement_timeout=2", db.url());
    let store = SqlStore::from_dsn(&dsn).unwrap();
    db.kill();
    let saved = timed(
        "an attempt",
        Fault::Kill,
        store.save(&Key::new(unique("t")), TTL),
    )
    .await;
    assert!(saved.is_err(), "{saved:?}");
    let settling = Instant::now();
    assert!(xtr_lock::settle(Duration::from_secs(30)).await);
    let took = settling.elapsed();
    assert!(took < Duration::from_secs(1), "settled after {took:?}");
    timed("close", Fault::Kill, store.close()).await.unwrap();
}

async fn memcached_calls_are_bounded(fault: Fault) {
    let mut server = MemcachedServer::start();
    let (proxy, freezer) = Freezer::start(server.port());
    let dsn = format!("memcached://127.0.0.1:{proxy}?connect_timeout={BOUND}&timeout={BOUND}");
    let store: Arc<dyn Store> = Arc::new(MemcachedStore::from_dsn(&dsn).unwrap());
    every_call_is_bounded(store, fault, || match fault {
        Fault::Freeze => freezer.freeze(),
        Fault::Pause => server.pause(),
        Fault::Kill => server.kill(),
    })
    .await;
    freezer.thaw();
    if matches!(fault, Fault::Pause) {
        server.resume();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_calls_are_bounded_behind_a_frozen_proxy() {
    memcached_calls_are_bounded(Fault::Freeze).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_calls_are_bounded_on_a_paused_server() {
    memcached_calls_are_bounded(Fault::Pause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_calls_are_bounded_on_a_killed_server() {
    memcached_calls_are_bounded(Fault::Kill).await;
}

/// MySQL answers most errors with the generic SQLSTATE `HY000`: one that cannot pass (here a
/// column the lock table should not have, without a default) is not worth retrying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_errors_that_cannot_pass_are_not_temporary() {
    let db = Db::mariadb();
    db.query(
        "CREATE TABLE lock_keys (key_id VARCHAR(64) NOT NULL PRIMARY KEY, \
         key_token VARCHAR(44) NOT NULL, key_expiration INTEGER UNSIGNED NOT NULL, \
         owner VARCHAR(20) NOT NULL)",
    );
    let store = db.store();
    let err = store
        .save(&Key::new(unique("extra-column")), TTL)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("owner"), "{err}");
    assert!(!err.is_temporary(), "{err}");
}

/// A key can name any SQLite path (a key someone edited included): releasing or checking it
/// finds nothing to do where there is no database, and never makes the file.
#[tokio::test]
async fn an_sqlite_release_never_makes_the_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nothing-here.db");
    let dsn = format!("sqlite://{}?create_table=true", path.display());
    let store = SqlStore::from_dsn(&dsn).unwrap();
    let key = Key::new("sqlite:absent");
    // A key that holds a token, as one from another process would.
    let _ = key.token("sql");
    assert!(!store.delete(&key).await.unwrap());
    assert!(!store.exists(&key).await.unwrap().is_held());
    store.close().await.unwrap();
    assert!(!path.exists(), "a release made {}", path.display());
}
