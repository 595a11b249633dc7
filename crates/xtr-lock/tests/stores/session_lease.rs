//! Session locks (PostgreSQL advisory locks, MySQL `GET_LOCK`) can be taken from a holder that
//! is alive but silent: the server ends the session of a client that stopped talking
//! (`idle_session_timeout`, `wait_timeout`, its TCP keepalive) and frees its locks.
//! `lease_remaining` says how long the lock certainly lasts, counted only from the last round
//! trip the server answered: another holder never gets the lock before that.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::{Key, MySqlLockStore, PgAdvisoryStore, Store};
use xtr_lock_testkit::hook_proxy::Freezer;
use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::postgres::PostgresServer;

/// `holder` (behind `freezer`) holds; it is cut off; `rival` (straight to the server) tries
/// until it gets the lock, which must not be before the lease `holder` had when it went silent.
async fn a_silent_holders_lock_is_taken_only_after_its_lease(
    holder: Arc<dyn Store>,
    rival: Arc<dyn Store>,
    freezer: &Freezer,
    silence: Duration,
) {
    let resource = format!("lease:{}", std::process::id());
    let key = Key::new(&resource);
    assert!(holder.save(&key, None).await.unwrap().is_acquired());
    // The pings (every 0.2 s) keep the lease at about `silence` less the margin.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let lease = holder.lease_remaining(&key).expect("a lease while held");
    assert!(
        lease <= silence && lease + Duration::from_millis(1800) >= silence,
        "lease {lease:?} for a session ended after {silence:?} of silence"
    );
    let other = Key::new(&resource);
    assert!(!rival.save(&other, None).await.unwrap().is_acquired());

    freezer.freeze();
    let silent = Instant::now();
    let lease = holder.lease_remaining(&key).expect("a lease while held");
    let taken = loop {
        assert!(
            silent.elapsed() < silence + Duration::from_secs(20),
            "the silent holder's session was never ended"
        );
        if rival
            .save(&other, None)
            .await
            .is_ok_and(|s| s.is_acquired())
        {
            break silent.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        taken >= lease,
        "taken {taken:?} after the holder went silent, inside its lease of {lease:?}"
    );
    // No answer since: the lease only shrinks.
    let left = holder.lease_remaining(&key);
    assert!(left.is_none_or(|l| l < lease), "{left:?}");
    freezer.thaw();
    rival.delete(&other).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_stopped_holders_advisory_lock_is_taken_after_its_lease() {
    let server = PostgresServer::start();
    server.psql("ALTER SYSTEM SET idle_session_timeout = '3s'");
    server.psql("SELECT pg_reload_conf()");
    let (proxy, freezer) = Freezer::start(server.port());
    let dsn = |port: u16| {
        format!("postgresql+advisory://postgres@127.0.0.1:{port}/postgres?keepalive=0.2")
    };
    let holder = Arc::new(PgAdvisoryStore::from_dsn(&dsn(proxy)).unwrap());
    let rival = Arc::new(PgAdvisoryStore::from_dsn(&dsn(server.port())).unwrap());
    a_silent_holders_lock_is_taken_only_after_its_lease(
        holder,
        rival,
        &freezer,
        Duration::from_secs(3),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_stopped_holders_named_lock_is_taken_after_its_lease() {
    let server = MariaDbServer::start();
    server.sql("SET GLOBAL wait_timeout = 3");
    let (proxy, freezer) = Freezer::start(server.port());
    let dsn = |port: u16| format!("mysql+getlock://root@127.0.0.1:{port}/xtr?keepalive=0.2");
    let holder = Arc::new(MySqlLockStore::from_dsn(&dsn(proxy)).unwrap());
    let rival = Arc::new(MySqlLockStore::from_dsn(&dsn(server.port())).unwrap());
    a_silent_holders_lock_is_taken_only_after_its_lease(
        holder,
        rival,
        &freezer,
        Duration::from_secs(3),
    )
    .await;
}

/// Nothing held, no lease; a server that never ends a silent client's session (PostgreSQL's
/// defaults on a Unix socket) gives none either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lease_without_a_hold() {
    let server = PostgresServer::start();
    let dsn = format!(
        "postgresql+advisory://postgres@127.0.0.1:{}/postgres",
        server.port()
    );
    let store = PgAdvisoryStore::from_dsn(&dsn).unwrap();
    let key = Key::new("lease:none");
    assert_eq!(store.lease_remaining(&key), None);
    assert!(store.save(&key, None).await.unwrap().is_acquired());
    // TCP with the operating system's keepalive: hours, and some.
    let lease = store.lease_remaining(&key).expect("a lease while held");
    assert!(lease > Duration::from_secs(60), "{lease:?}");
    assert!(store.delete(&key).await.unwrap());
    assert_eq!(store.lease_remaining(&key), None);
}

/// A lock granted after a wait longer than the server lets a silent session live has its
/// whole lease when the grant is answered: it used to be dated from the wait's start, so it
/// read as run out at once (and `xtr-lock run` took the lock for lost and stopped its command).
async fn a_grant_after_a_long_wait_has_a_full_lease(
    holder: Arc<dyn Store>,
    waiter: Arc<dyn Store>,
    silence: Duration,
) {
    let resource = format!("lease-wait:{}", std::process::id());
    let first = Key::new(&resource);
    assert!(holder.save(&first, None).await.unwrap().is_acquired());
    let second = Key::new(&resource);
    let wait = {
        let (waiter, second) = (waiter.clone(), second.clone());
        tokio::spawn(async move { waiter.wait_and_save(&second, None).await })
    };
    // The holder's pings keep its session; the waiter's session is busy with its wait.
    tokio::time::sleep(silence + Duration::from_secs(1)).await;
    assert!(!wait.is_finished());
    assert!(holder.delete(&first).await.unwrap());
    assert!(wait.await.unwrap().unwrap().is_acquired());
    let lease = waiter.lease_remaining(&second).expect("a lease while held");
    assert!(
        lease + Duration::from_millis(2500) >= silence,
        "a lease of {lease:?} right after the grant, for a session ended after {silence:?}"
    );
    assert!(waiter.delete(&second).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_grant_after_a_long_wait_has_a_full_lease() {
    let server = PostgresServer::start();
    server.psql("ALTER SYSTEM SET idle_session_timeout = '3s'");
    server.psql("SELECT pg_reload_conf()");
    let dsn = format!(
        "postgresql+advisory://postgres@127.0.0.1:{}/postgres?keepalive=0.2",
        server.port()
    );
    let store = || Arc::new(PgAdvisoryStore::from_dsn(&dsn).unwrap()) as Arc<dyn Store>;
    a_grant_after_a_long_wait_has_a_full_lease(store(), store(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_grant_after_a_long_wait_has_a_full_lease() {
    let server = MariaDbServer::start();
    server.sql("SET GLOBAL wait_timeout = 3");
    let dsn = format!(
        "mysql+getlock://root@127.0.0.1:{}/xtr?keepalive=0.2",
        server.port()
    );
    let store = || Arc::new(MySqlLockStore::from_dsn(&dsn).unwrap()) as Arc<dyn Store>;
    a_grant_after_a_long_wait_has_a_full_lease(store(), store(), Duration::from_secs(3)).await;
}

/// A `keepalive` longer than the server lets a silent session live is shortened to a third of
/// that: the session of a live holder is never ended for silence. With `keepalive=30` and
/// `idle_session_timeout` at 2 s, the lock used to be lost after 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_keepalive_still_keeps_a_session_the_server_ends_sooner() {
    let server = PostgresServer::start();
    server.psql("ALTER SYSTEM SET idle_session_timeout = '2s'");
    server.psql("SELECT pg_reload_conf()");
    let dsn = format!(
        "postgresql+advisory://postgres@127.0.0.1:{}/postgres?keepalive=30",
        server.port()
    );
    let store = PgAdvisoryStore::from_dsn(&dsn).unwrap();
    let key = Key::new("lease:keepalive");
    assert!(store.save(&key, None).await.unwrap().is_acquired());
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        store.exists(&key).await.unwrap().is_held(),
        "the session was ended"
    );
    assert!(store.delete(&key).await.unwrap());
}
