//! The PostgreSQL advisory store on a server the testkit starts: cancellation at each await
//! point (asserted on `pg_locks`), a terminated backend reported as a loss, a paused server and
//! a deadline, the two key modes, collisions, promotion deadlocks, introspection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Connection as _;
use sqlx::postgres::PgConnection;
use xtr_lock::{ErrorKind, LockFactory, Lockable as _, PgAdvisoryStore, Release, Store as _};
use xtr_lock_testkit::postgres::PostgresServer;

fn dsn(server: &PostgresServer, options: &str) -> String {
    let url = server.url();
    format!(
        "postgresql+advisory{}{options}",
        url.strip_prefix("postgres").unwrap()
    )
}

fn store(server: &PostgresServer, options: &str) -> PgAdvisoryStore {
    PgAdvisoryStore::from_dsn(&dsn(server, options)).unwrap()
}

/// A session of the test's own, outside the store.
async fn session(server: &PostgresServer) -> PgConnection {
    PgConnection::connect(&server.url()).await.unwrap()
}

/// The `pg_locks` rows (pid, mode, granted) of an advisory key, in this database.
async fn rows(conn: &mut PgConnection, key: i64) -> Vec<(i32, String, bool)> {
    let bits = key as u64;
    sqlx::query_as(
        "SELECT pid, mode, granted FROM pg_locks WHERE locktype = 'advisory' \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1 ORDER BY pid",
    )
    .bind((bits >> 32) as i64)
    .bind((bits & 0xFFFF_FFFF) as i64)
    .fetch_all(conn)
    .await
    .unwrap()
}

/// Waits (10 s at most) until the key's `pg_locks` rows satisfy `ok`; the last rows otherwise.
async fn until_rows(
    conn: &mut PgConnection,
    key: i64,
    ok: impl Fn(&[(i32, String, bool)]) -> bool,
) -> Vec<(i32, String, bool)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = rows(conn, key).await;
        if ok(&now) || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn try_lock(conn: &mut PgConnection, key: i64) -> bool {
    sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn unlock(conn: &mut PgConnection, key: i64) -> bool {
    sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_acquire_dropped_before_its_statement_leaves_no_lock() {
    let server = PostgresServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let mut probe = session(&server).await;
    let key = store.advisory_key("drop-before-send");
    for round in 0..20 {
        let lock = factory.create_lock("drop-before-send");
        {
            // Polled once: the command is sent to the holder's session, which is still
            // connecting (first rounds) or about to run the statement.
            let fut = lock.acquire();
            tokio::pin!(fut);
            let _ = futures_util::FutureExt::now_or_never(fut.as_mut());
        }
        drop(lock);
        let left = until_rows(&mut probe, key, <[_]>::is_empty).await;
        assert!(left.is_empty(), "round {round}: {left:?}");
    }
    // Once the sessions' clean-up has run (a dropped acquire's statement may still have been
    // on its way when the rows were read), the store holds nothing: the test takes the lock.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !try_lock(&mut probe, key).await {
        assert!(Instant::now() < deadline, "the store kept the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(unlock(&mut probe, key).await);
}

#[tokio::test]
async fn a_wait_dropped_in_the_server_is_cancelled_and_leaves_no_lock() {
    let server = PostgresServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let mut holder = session(&server).await;
    let mut probe = session(&server).await;
    let key = store.advisory_key("drop-during-wait");
    assert!(try_lock(&mut holder, key).await);
    for mode in ["write", "read"] {
        let lock = factory.create_lock("drop-during-wait");
        let waiting = async {
            if mode == "write" {
                lock.acquire().await
            } else {
                lock.acquire_read().await
            }
        };
        let watched = async {
            // The waiter is in the server: a row not granted.
            let seen = until_rows(&mut probe, key, |r| r.iter().any(|(_, _, g)| !g)).await;
            assert!(seen.iter().any(|(_, _, g)| !g), "{mode}: {seen:?}");
        };
        tokio::select! {
            r = waiting => panic!("{mode}: the wait ended while the lock was held: {r:?}"),
            () = watched => {}
        }
        // Dropped: the server-side wait is cancelled, not left to be granted later.
        let left = until_rows(&mut probe, key, |r| r.len() == 1).await;
        assert_eq!(left.len(), 1, "{mode}: only the test's own hold: {left:?}");
    }
    assert!(unlock(&mut holder, key).await);
    let left = until_rows(&mut probe, key, <[_]>::is_empty).await;
    assert!(
        left.is_empty(),
        "nobody was granted the lock later: {left:?}"
    );
    // The connection the cancelled waiters used is clean for the next holder.
    let lock = factory.create_lock("drop-during-wait");
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(rows(&mut probe, key).await.len(), 1);
    assert_eq!(lock.release().await.unwrap(), Release::Released);
}

/// A cancel request that reaches the server before the lock statement it is meant for finds
/// nothing to cancel: the store repeats it until the wait answers, so no wait is left behind a
/// holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_dropped_as_it_is_sent_is_cancelled_all_the_same() {
    let server = PostgresServer::start();
    // A long statement timeout: closing the session must not be what ends a lost wait.
    let store = store(&server, "?statement_timeout=60");
    let factory = LockFactory::new(store.clone());
    let mut holder = session(&server).await;
    let mut probe = session(&server).await;
    let key = store.advisory_key("drop-as-sent");
    assert!(try_lock(&mut holder, key).await);
    for round in 0..400u64 {
        // A new holder each round: its session starts, connects or takes an idle connection.
        let lock = factory.create_lock("drop-as-sent");
        // From before the statement is sent to after it waits, in 5 µs steps.
        let budget = Duration::from_micros(round * 5);
        let r = if round % 2 == 0 {
            tokio::time::timeout(budget, lock.acquire()).await
        } else {
            tokio::time::timeout(budget, lock.acquire_read()).await
        };
        assert!(
            r.is_err(),
            "round {round}: the wait ended while held: {r:?}"
        );
        // The holder's own session answers, and the server has no wait left.
        assert!(!lock.is_acquired().await.unwrap(), "round {round}");
        let left = until_rows(&mut probe, key, |r| r.len() == 1).await;
        assert_eq!(
            left.len(),
            1,
            "round {round}: only the test's own hold: {left:?}"
        );
    }
    assert!(unlock(&mut holder, key).await);
    assert!(
        rows(&mut probe, key).await.is_empty(),
        "nobody got it later"
    );
}

/// A free lock is granted at once, and the cancel request for a caller that went can land just
/// after the grant: the statement then fails with "cancelled" while its session-level lock
/// stays. The session must ask what it holds, not believe the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_lock_dropped_as_it_is_granted_is_not_kept_by_a_cancelled_statement() {
    let server = PostgresServer::start();
    let store = store(&server, "?statement_timeout=60");
    let factory = LockFactory::new(store.clone());
    let mut probe = session(&server).await;
    let key = store.advisory_key("drop-free");
    for round in 0..400u64 {
        let lock = factory.create_lock("drop-free");
        // From before the statement is sent to after it answers, in 5 µs steps.
        let budget = Duration::from_micros((round % 200) * 5);
        let r = if round % 2 == 0 {
            tokio::time::timeout(budget, lock.acquire()).await
        } else {
            tokio::time::timeout(budget, lock.acquire_read()).await
        };
        if let Ok(r) = r {
            // It finished in time: a hold of this round's, let go again.
            r.unwrap();
            assert_eq!(
                lock.release().await.unwrap(),
                Release::Released,
                "round {round}"
            );
        }
        drop(lock);
        let left = until_rows(&mut probe, key, <[_]>::is_empty).await;
        assert!(left.is_empty(), "round {round}: the store kept {left:?}");
    }
    assert!(try_lock(&mut probe, key).await, "the store holds nothing");
    assert!(unlock(&mut probe, key).await);
}

#[tokio::test]
async fn a_wait_dropped_as_it_is_granted_leaves_no_lock() {
    let server = PostgresServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let mut holder = session(&server).await;
    let mut probe = session(&server).await;
    let key = store.advisory_key("drop-at-grant");
    for round in 0..30u64 {
        assert!(try_lock(&mut holder, key).await);
        let lock = factory.create_lock("drop-at-grant");
        {
            let wait = lock.acquire();
            tokio::pin!(wait);
            let seen = tokio::select! {
                r = &mut wait => panic!("granted while held: {r:?}"),
                seen = until_rows(&mut probe, key, |r| r.iter().any(|(_, _, g)| !g)) => seen,
            };
            assert!(seen.iter().any(|(_, _, g)| !g), "{seen:?}");
            // Release, and drop the waiter a varying moment later: before, as, or after the
            // grant reaches it.
            assert!(unlock(&mut holder, key).await);
            let delay = Duration::from_micros(round * 50);
            let _ = tokio::time::timeout(delay, &mut wait).await;
        }
        drop(lock);
        let left = until_rows(&mut probe, key, <[_]>::is_empty).await;
        assert!(left.is_empty(), "round {round}: {left:?}");
    }
}

#[tokio::test]
async fn a_terminated_backend_is_a_lost_lock() {
    let server = PostgresServer::start();
    let store = store(&server, "?keepalive=0.2");
    let factory = LockFactory::new(store.clone());
    let lock = factory.create_lock("terminated");
    let guard = lock.lock().await.unwrap();
    let pid = store.backend_pid(lock.key()).expect("a holding session");
    let mut probe = session(&server).await;
    let holders = store.holders("terminated").await.unwrap();
    assert_eq!(holders.len(), 1);
    assert!(
        holders[0]
            .backend
            .as_deref()
            .unwrap()
            .starts_with(&format!("backend {pid} (xtr-lock")),
        "{holders:?}"
    );
    let _: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut probe)
        .await
        .unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the loss is reported");
    assert_eq!(lost.reason, xtr_lock::LostReason::Disconnected, "{lost}");
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);
    // Taken by another holder at once: the server freed it with the session.
    assert!(
        factory
            .create_lock("terminated")
            .try_acquire()
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_paused_server_does_not_outlast_a_deadline() {
    let server = PostgresServer::start();
    let store = store(&server, "?statement_timeout=1&connect_timeout=1");
    let factory = LockFactory::new(store.clone());
    let key = store.advisory_key("paused");
    let mut holder = session(&server).await;
    assert!(try_lock(&mut holder, key).await);
    let lock = factory.create_lock("paused");
    server.pause();
    let started = Instant::now();
    let got = lock.acquire_timeout(Duration::from_millis(500)).await;
    let took = started.elapsed();
    server.resume();
    assert!(!matches!(got, Ok(true)), "{got:?}");
    assert!(took < Duration::from_secs(5), "the deadline held: {took:?}");
    // After the server comes back, nothing is left of the waiter.
    drop(lock);
    assert!(unlock(&mut holder, key).await);
    let mut probe = session(&server).await;
    let left = until_rows(&mut probe, key, <[_]>::is_empty).await;
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn the_two_key_modes_do_not_exclude_each_other() {
    let server = PostgresServer::start();
    let crc_store = store(&server, "?keys=crc32");
    let sha = LockFactory::new(store(&server, ""));
    let crc = LockFactory::new(crc_store.clone());
    let a = sha.create_lock("modes");
    let b = crc.create_lock("modes");
    assert!(a.try_acquire().await.unwrap());
    assert!(
        b.try_acquire().await.unwrap(),
        "two key spaces: a deployment picks one per set of resources"
    );
    // crc32 keys are Symfony's: classid 0, objid = crc32 in pg_locks.
    assert_eq!(crc_store.advisory_key("res1"), 0xFBA2_94CF);
    let mut probe = session(&server).await;
    let shown = rows(&mut probe, crc_store.advisory_key("modes")).await;
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].1, "ExclusiveLock");
    let _ = a.release().await.unwrap();
    let _ = b.release().await.unwrap();
}

#[tokio::test]
async fn colliding_crc32_resources_exclude_each_other_and_sha256_ones_do_not() {
    let server = PostgresServer::start();
    for (options, collide) in [("?keys=crc32", true), ("", false)] {
        let factory = LockFactory::new(store(&server, options));
        let a = factory.create_lock("invoice:29685295");
        let b = factory.create_lock("invoice:32060020");
        assert!(a.try_acquire().await.unwrap());
        assert_eq!(b.try_acquire().await.unwrap(), !collide, "{options:?}");
        // A read beside a write is refused exactly when the keys collide.
        assert_eq!(b.try_acquire_read().await.unwrap(), !collide, "{options:?}");
        let _ = a.release().await.unwrap();
        let _ = b.release().await.unwrap();
    }
}

#[tokio::test]
async fn two_readers_promoting_at_once_deadlock_and_the_one_that_gives_way_still_reads() {
    let server = PostgresServer::start();
    let factory = LockFactory::new(store(&server, ""));
    let r1 = factory.create_lock("promote-deadlock");
    let r2 = factory.create_lock("promote-deadlock");
    assert!(r1.try_acquire_read().await.unwrap());
    assert!(r2.try_acquire_read().await.unwrap());
    let (p1, p2) = (r1.clone(), r2.clone());
    let mut t1 = tokio::spawn(async move { p1.acquire().await });
    let mut t2 = tokio::spawn(async move { p2.acquire().await });
    // The server aborts one after its deadlock_timeout (1 s).
    let (first, loser, winner_task) = tokio::select! {
        r = &mut t1 => (r.unwrap(), &r1, t2),
        r = &mut t2 => (r.unwrap(), &r2, t1),
    };
    let err = first.expect_err("one promotion gives way");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert!(err.to_string().contains("deadlock"), "{err}");
    assert_eq!(loser.held_mode(), Some(xtr_lock::Mode::Read));
    assert!(loser.is_acquired().await.unwrap(), "the read lock is kept");
    assert_eq!(loser.release().await.unwrap(), Release::Released);
    tokio::time::timeout(Duration::from_secs(10), winner_task)
        .await
        .expect("the other promotion completes once the reader left")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn release_unlocks_exactly_what_was_locked() {
    let server = PostgresServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let key = store.advisory_key("exact");
    let mut probe = session(&server).await;
    let lock = factory.create_lock("exact");
    // Re-acquiring does not stack holds; promotion and demotion leave one row of one mode.
    assert!(lock.try_acquire_read().await.unwrap());
    assert!(lock.try_acquire_read().await.unwrap());
    assert!(lock.try_acquire().await.unwrap());
    let now = rows(&mut probe, key).await;
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].1, "ExclusiveLock");
    assert!(lock.try_acquire_read().await.unwrap());
    let now = rows(&mut probe, key).await;
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].1, "ShareLock");
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert!(rows(&mut probe, key).await.is_empty());
    assert!(store.location("exact").unwrap().contains("objsubid=1"));
}

#[test]
fn dsn_errors_and_display_never_show_the_password() {
    let s = PgAdvisoryStore::from_dsn("postgresql+advisory://app:hunter2@db:6543/locks").unwrap();
    assert_eq!(s.to_string(), "postgresql+advisory://db:6543/locks");
    assert!(!format!("{s:?}").contains("hunter2"));
    let via_factory =
        xtr_lock::StoreFactory::create_store("postgres+advisory://app:hunter2@db/locks?keys=crc32")
            .unwrap();
    assert_eq!(
        via_factory.to_string(),
        "postgres+advisory://db:5432/locks?keys=crc32"
    );
    let err =
        xtr_lock::StoreFactory::create_store("postgresql+advisory://app:hunter2@db/x?keys=md5")
            .unwrap_err()
            .to_string();
    assert!(err.contains("keys") && !err.contains("hunter2"), "{err}");
    let _ = Arc::new(s);
}

/// A scope whose body panics releases its lock; taking the lock again at once must not race a
/// stray background release of the old hold (it did: the panicking guard also scheduled one,
/// which reached the session after the new acquire and unlocked it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_again_after_a_panicking_scope_stays_held() {
    let server = PostgresServer::start();
    let store = store(&server, "");
    let factory = LockFactory::new(store.clone());
    let mut probe = session(&server).await;
    let key = store.advisory_key("panic-again");
    let lock = factory.create_lock("panic-again");
    for round in 0..60 {
        let panicked = tokio::spawn({
            let lock = lock.clone();
            async move {
                let _: Result<(), xtr_lock::Error> =
                    lock.scoped(async { panic!("body panicked") }).await;
            }
        })
        .await;
        assert!(panicked.unwrap_err().is_panic());
        lock.acquire().await.unwrap();
        // Asking takes the holder's turn, which waits for its pending clean-ups: a stray
        // release would have run by then.
        assert!(lock.is_acquired().await.unwrap(), "round {round}");
        assert_eq!(rows(&mut probe, key).await.len(), 1, "round {round}");
        assert_eq!(
            lock.release().await.unwrap(),
            Release::Released,
            "round {round}"
        );
    }
}

/// Neither session store counts: a semaphore on either is refused as unsupported, saying why,
/// before anything is sent (the DSNs point at a port nobody listens on).
#[tokio::test]
async fn semaphores_are_refused_on_session_locks_saying_why() {
    let stores: [Arc<dyn xtr_lock::Store>; 2] = [
        Arc::new(PgAdvisoryStore::from_dsn("postgresql+advisory://u@127.0.0.1:1/db").unwrap()),
        Arc::new(xtr_lock::MySqlLockStore::from_dsn("mysql+getlock://u@127.0.0.1:1/db").unwrap()),
    ];
    for store in stores {
        assert!(!store.capabilities().counting);
        let semaphore = LockFactory::from_arc(store)
            .create_semaphore("sem-refused", 3)
            .unwrap();
        let err = semaphore.try_acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("one holder and no count"), "{err}");
        let err = semaphore.usage().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    }
}
