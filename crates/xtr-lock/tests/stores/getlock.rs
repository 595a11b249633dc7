//! The MySQL/MariaDB `GET_LOCK` store on a server the testkit starts: cancellation at each
//! await point (asserted with `IS_USED_LOCK`), a killed connection reported as a loss, a paused
//! server and a deadline, lock names (computed in SQL too), introspection, other programs'
//! `GET_LOCK` on the same name.

use std::time::{Duration, Instant};

use sqlx::Connection as _;
use sqlx::mysql::MySqlConnection;
use xtr_lock::{ErrorKind, LockFactory, Lockable as _, MySqlLockStore, Release, Store as _};
use xtr_lock_testkit::mariadb::MariaDbServer;

fn dsn(server: &MariaDbServer, options: &str) -> String {
    let url = server.url();
    format!(
        "mysql+getlock{}{options}",
        url.strip_prefix("mysql").unwrap()
    )
}

fn store(server: &MariaDbServer, options: &str) -> MySqlLockStore {
    MySqlLockStore::from_dsn(&dsn(server, options)).unwrap()
}

/// A session of the test's own, outside the store.
async fn session(server: &MariaDbServer) -> MySqlConnection {
    MySqlConnection::connect(&server.url()).await.unwrap()
}

/// The connection holding `name`, if any.
async fn holder(conn: &mut MySqlConnection, name: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)")
        .bind(name)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Waits (10 s at most) until `name`'s holder satisfies `ok`; the last answer otherwise.
async fn until_holder(
    conn: &mut MySqlConnection,
    name: &str,
    ok: impl Fn(Option<i64>) -> bool,
) -> Option<i64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = holder(conn, name).await;
        if ok(now) || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many sessions wait in `GET_LOCK` on the server (the process list's state).
async fn waiting(conn: &mut MySqlConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE INFO LIKE 'SELECT GET_LOCK(%' AND ID <> CONNECTION_ID()",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

async fn until_waiting(conn: &mut MySqlConnection, n: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = waiting(conn).await;
        if now == n || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn get_lock(conn: &mut MySqlConnection, name: &str) -> bool {
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(name)
        .fetch_one(conn)
        .await
        .unwrap();
    got == Some(1)
}

async fn release_lock(conn: &mut MySqlConnection, name: &str) -> bool {
    let done: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
        .bind(name)
        .fetch_one(conn)
        .await
        .unwrap();
    done == Some(1)
}

#[tokio::test]
async fn an_acquire_dropped_before_its_statement_leaves_no_lock() {
    let server = MariaDbServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let mut probe = session(&server).await;
    let name = store.lock_name("drop-before-send");
    for round in 0..20 {
        let lock = factory.create_lock("drop-before-send");
        {
            let fut = lock.acquire();
            tokio::pin!(fut);
            let _ = futures_util::FutureExt::now_or_never(fut.as_mut());
        }
        drop(lock);
        let left = until_holder(&mut probe, &name, |h| h.is_none()).await;
        assert_eq!(left, None, "round {round}");
    }
    // Once the sessions' clean-up has run, the store holds nothing: the test takes the lock.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get_lock(&mut probe, &name).await {
        assert!(Instant::now() < deadline, "the store kept the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(release_lock(&mut probe, &name).await);
}

/// A free lock is granted at once, and the kill meant for a caller that went can land just
/// after the grant: whatever the statement answered, the session must not keep the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_lock_dropped_as_it_is_granted_is_not_kept() {
    let server = MariaDbServer::start();
    let store = store(&server, "?statement_timeout=60");
    let factory = LockFactory::new(store.clone());
    let mut probe = session(&server).await;
    let name = store.lock_name("drop-free");
    for round in 0..400u64 {
        let lock = factory.create_lock("drop-free");
        // From before the statement is sent to after it answers, in 5 µs steps.
        let budget = Duration::from_micros((round % 200) * 5);
        if let Ok(r) = tokio::time::timeout(budget, lock.acquire()).await {
            // It finished in time: a hold of this round's, let go again.
            r.unwrap();
            assert_eq!(
                lock.release().await.unwrap(),
                Release::Released,
                "round {round}"
            );
        }
        drop(lock);
        let left = until_holder(&mut probe, &name, |h| h.is_none()).await;
        assert_eq!(left, None, "round {round}: the store kept the lock");
    }
    assert!(get_lock(&mut probe, &name).await, "the store holds nothing");
    assert!(release_lock(&mut probe, &name).await);
}

#[tokio::test]
async fn a_wait_dropped_in_the_server_is_killed_and_leaves_no_lock() {
    let server = MariaDbServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let mut owner = session(&server).await;
    let mut probe = session(&server).await;
    let name = store.lock_name("drop-during-wait");
    assert!(get_lock(&mut owner, &name).await);
    for round in 0..3 {
        let lock = factory.create_lock("drop-during-wait");
        let watched = async {
            assert_eq!(until_waiting(&mut probe, 1).await, 1, "round {round}");
        };
        tokio::select! {
            r = lock.acquire() => panic!("round {round}: the wait ended while held: {r:?}"),
            () = watched => {}
        }
        // Dropped: the server-side wait is killed, not left to be granted later.
        assert_eq!(until_waiting(&mut probe, 0).await, 0, "round {round}");
    }
    assert!(release_lock(&mut owner, &name).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(holder(&mut probe, &name).await, None, "nobody got it later");
    // The connection the killed waiters used is clean for the next holder.
    let lock = factory.create_lock("drop-during-wait");
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert_eq!(holder(&mut probe, &name).await, None);
}

/// A kill that reaches the server before the `GET_LOCK` it is meant for finds nothing to kill:
/// the store repeats it until the wait answers, so no wait is left behind a holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_dropped_as_it_is_sent_is_killed_all_the_same() {
    let server = MariaDbServer::start();
    // A long statement timeout: closing the session must not be what ends a lost wait.
    let store = store(&server, "?statement_timeout=60");
    let factory = LockFactory::new(store.clone());
    let mut owner = session(&server).await;
    let mut probe = session(&server).await;
    let name = store.lock_name("drop-as-sent");
    assert!(get_lock(&mut owner, &name).await);
    for round in 0..400u64 {
        // A new holder each round: its session starts, connects or takes an idle connection.
        let lock = factory.create_lock("drop-as-sent");
        // From before the statement is sent to after it waits, in 5 µs steps.
        let budget = Duration::from_micros(round * 5);
        let r = tokio::time::timeout(budget, lock.acquire()).await;
        assert!(
            r.is_err(),
            "round {round}: the wait ended while held: {r:?}"
        );
        // The holder's own session answers, and the server has no wait left.
        assert!(!lock.is_acquired().await.unwrap(), "round {round}");
        assert_eq!(until_waiting(&mut probe, 0).await, 0, "round {round}");
    }
    assert!(release_lock(&mut owner, &name).await);
    assert_eq!(holder(&mut probe, &name).await, None, "nobody got it later");
}

#[tokio::test]
async fn a_wait_dropped_as_it_is_granted_leaves_no_lock() {
    let server = MariaDbServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let mut owner = session(&server).await;
    let mut probe = session(&server).await;
    let name = store.lock_name("drop-at-grant");
    for round in 0..30u64 {
        assert!(get_lock(&mut owner, &name).await);
        let lock = factory.create_lock("drop-at-grant");
        {
            let wait = lock.acquire();
            tokio::pin!(wait);
            tokio::select! {
                r = &mut wait => panic!("granted while held: {r:?}"),
                n = until_waiting(&mut probe, 1) => assert_eq!(n, 1),
            }
            // Release, and drop the waiter a varying moment later: before, as, or after the
            // grant reaches it.
            assert!(release_lock(&mut owner, &name).await);
            let delay = Duration::from_micros(round * 50);
            let _ = tokio::time::timeout(delay, &mut wait).await;
        }
        drop(lock);
        let left = until_holder(&mut probe, &name, |h| h.is_none()).await;
        assert_eq!(left, None, "round {round}");
    }
}

#[tokio::test]
async fn a_killed_connection_is_a_lost_lock() {
    let server = MariaDbServer::start();
    let store = store(&server, "?keepalive=0.2");
    let factory = LockFactory::new(store.clone());
    let lock = factory.create_lock("killed");
    let guard = lock.lock().await.unwrap();
    let id = store.connection_id(lock.key()).expect("a holding session");
    let holders = store.holders("killed").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].mode, xtr_lock::Mode::Write);
    let shown = holders[0].backend.as_deref().unwrap();
    assert!(
        shown.starts_with(&format!("connection {id} (root@")),
        "{shown}"
    );
    let mut probe = session(&server).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
        .execute(&mut probe)
        .await
        .unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the loss is reported");
    assert_eq!(lost.reason, xtr_lock::LostReason::Disconnected, "{lost}");
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);
    assert!(factory.create_lock("killed").try_acquire().await.unwrap());
}

#[tokio::test]
async fn a_paused_server_does_not_outlast_a_deadline() {
    let server = MariaDbServer::start();
    let store = store(&server, "?statement_timeout=1&connect_timeout=1");
    let factory = LockFactory::new(store.clone());
    let name = store.lock_name("paused");
    let mut owner = session(&server).await;
    assert!(get_lock(&mut owner, &name).await);
    let lock = factory.create_lock("paused");
    server.pause();
    let started = Instant::now();
    let got = lock.acquire_timeout(Duration::from_millis(500)).await;
    let took = started.elapsed();
    server.resume();
    assert!(!matches!(got, Ok(true)), "{got:?}");
    assert!(took < Duration::from_secs(5), "the deadline held: {took:?}");
    drop(lock);
    assert!(release_lock(&mut owner, &name).await);
    let mut probe = session(&server).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(until_waiting(&mut probe, 0).await, 0);
    assert_eq!(holder(&mut probe, &name).await, None);
}

#[tokio::test]
async fn lock_names_are_the_documented_digest_and_other_programs_share_them() {
    let server = MariaDbServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let mut other = session(&server).await;
    for resource in ["res1", "Invoice", "invoice", "ключ", &"long-".repeat(40)] {
        // The formula the docs give, computed by the server.
        let in_sql: String = sqlx::query_scalar(
            "SELECT CONCAT('xtr-lock:', LEFT(SHA2(CONCAT(DATABASE(), CHAR(0), ?), 256), 55))",
        )
        .bind(resource)
        .fetch_one(&mut other)
        .await
        .unwrap();
        assert_eq!(store.lock_name(resource), in_sql, "{resource:?}");
    }
    assert_ne!(store.lock_name("Invoice"), store.lock_name("invoice"));
    // Another program holding the name excludes us, and the reverse.
    let name = store.lock_name("shared-name");
    assert!(get_lock(&mut other, &name).await);
    let lock = factory.create_lock("shared-name");
    assert!(!lock.try_acquire().await.unwrap());
    assert!(release_lock(&mut other, &name).await);
    assert!(lock.try_acquire().await.unwrap());
    assert!(!get_lock(&mut other, &name).await);
    // Case: two resources differing in case are two locks, whatever the server's collation.
    let upper = factory.create_lock("Invoice");
    let lower = factory.create_lock("invoice");
    assert!(upper.try_acquire().await.unwrap());
    assert!(lower.try_acquire().await.unwrap());
    for l in [&lock, &upper, &lower] {
        assert_eq!(l.release().await.unwrap(), Release::Released);
    }
    assert!(
        store
            .location("x")
            .unwrap()
            .starts_with("GET_LOCK name xtr-lock:")
    );
}

#[tokio::test]
async fn a_read_lock_is_exclusive_and_reacquiring_does_not_stack() {
    let server = MariaDbServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let mut probe = session(&server).await;
    let name = store.lock_name("exclusive-only");
    let a = factory.create_lock("exclusive-only");
    let b = factory.create_lock("exclusive-only");
    assert!(a.try_acquire_read().await.unwrap());
    assert!(!b.try_acquire_read().await.unwrap(), "no shared mode");
    assert!(a.try_acquire().await.unwrap());
    assert!(a.try_acquire().await.unwrap());
    // One release lets go: nothing stacked on the server.
    assert_eq!(a.release().await.unwrap(), Release::Released);
    assert_eq!(holder(&mut probe, &name).await, None);
}

#[test]
fn dsn_errors_and_display_never_show_the_password() {
    let s = MySqlLockStore::from_dsn("mysql+getlock://app:hunter2@db:3307/locks").unwrap();
    assert_eq!(s.to_string(), "mysql+getlock://db:3307/locks");
    assert!(!format!("{s:?}").contains("hunter2"));
    let via_factory =
        xtr_lock::StoreFactory::create_store("mariadb+getlock://app:hunter2@db/locks").unwrap();
    assert_eq!(via_factory.to_string(), "mariadb+getlock://db:3306/locks");
    assert!(!via_factory.capabilities().shared);
    for (dsn, says) in [
        ("mysql+getlock://app:hunter2@db/locks?keys=crc32", "keys="),
        ("mysql+getlock://app:hunter2@db", "name the database"),
        ("mysql+getlock://app:hunter2@db/x?keepalive=-1", "keepalive"),
        (
            "mysql+getlock://app:hunter2@[db/x",
            "invalid MySQL GET_LOCK",
        ),
    ] {
        let err = xtr_lock::StoreFactory::create_store(dsn).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{dsn}");
        let err = err.to_string();
        assert!(
            err.contains(says) && !err.contains("hunter2"),
            "{dsn}: {err}"
        );
    }
    let err = MySqlLockStore::from_dsn("postgresql+advisory://u:hunter2@h/db").unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let err = xtr_lock::PgAdvisoryStore::from_dsn("mysql+getlock://u:hunter2@h/db").unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}
