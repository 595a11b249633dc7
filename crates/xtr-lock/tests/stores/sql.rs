//! The SQL table store on real servers: the row format, the traps of each database, errors,
//! cancellation, a server killed mid-hold, the sweep.

use std::time::Duration;

use xtr_lock::store::{Holding, LostReason, sql_key_id};
use xtr_lock::{ErrorKind, Key, LockFactory, Lockable as _, SqlStore, Store as _, StoreFactory};

use crate::support::symfony_sql::Db;

const TTL: Option<Duration> = Some(Duration::from_secs(30));

fn unique(name: &str) -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    format!("sql:{name}:{:08x}", u32::from_le_bytes(b))
}

#[test]
fn key_ids_are_symfonys() {
    for (resource, id) in [
        (
            "res1",
            "0e405b9869cefa2cf895ca31bfc1f078fa18d539b5c9881beb1dbc18b5884c96",
        ),
        (
            "invoice:29685295",
            "301e30eb137dfa84fd4a2b3d6fd8a25d1b928f05fd99310be4603674c2c0a3cd",
        ),
        (
            "invoice:32060020",
            "4641ca686cf8560939d30fd4e77e4d6a0a6e408e139235e9f1c16edc299b5543",
        ),
        (
            "my/resource name:1",
            "61934be98b55bf8a0941c0a34a381de49c60330a302e6471482760631452ed15",
        ),
        (
            "",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        ),
        (
            "ключ",
            "1de36a32af798da0c1ac9297603a320ed8fe567cf21c9177112a4ce914ebb8be",
        ),
    ] {
        assert_eq!(sql_key_id(resource), id, "{resource:?}");
    }
}

#[test]
fn dsns_never_show_credentials() {
    let dsn = "postgres://app:hunter2@db.internal:5433/app?sslmode=disable&table=app_locks";
    let store = StoreFactory::create_store(dsn).unwrap();
    assert_eq!(
        store.to_string(),
        "postgres://db.internal:5433/app?table=app_locks"
    );
    assert!(!format!("{store:?}").contains("hunter2"));
    assert_eq!(store.locks_in().unwrap(), store.to_string());
    let err = StoreFactory::validate("mysql://root:hunter2@h/db?table=x;drop").unwrap_err();
    assert!(err.to_string().contains("invalid table name"), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[tokio::test]
async fn ttls_under_two_seconds_are_refused_before_anything_is_stored() {
    let store = SqlStore::from_dsn("sqlite::memory:?create_table=true").unwrap();
    let key = Key::new("short");
    for ttl in [None, Some(Duration::from_millis(1999))] {
        let err = store.save(&key, ttl).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("ttl"), "{err}");
    }
    assert!(store.holders("short").await.unwrap().is_empty());
}

/// The token is assigned before the expiry: with the other order, an attempt on someone
/// else's live row would extend that row. The row must come out exactly as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_refused_attempt_leaves_the_holders_row_untouched() {
    let db = Db::mariadb();
    let store = db.store();
    store.create_table().await.unwrap();
    let r = unique("trap");
    let id = sql_key_id(&r);
    let theirs = "T".repeat(43) + "=";
    db.query(&format!(
        "INSERT INTO lock_keys VALUES ('{id}', '{theirs}', UNIX_TIMESTAMP() + 100)"
    ));
    let before = db.query(&format!(
        "SELECT key_token, key_expiration FROM lock_keys WHERE key_id = '{id}'"
    ));
    let key = Key::new(&r);
    for _ in 0..3 {
        assert!(
            store
                .save(&key, Some(Duration::from_secs(1000)))
                .await
                .unwrap()
                .is_conflict()
        );
    }
    let after = db.query(&format!(
        "SELECT key_token, key_expiration FROM lock_keys WHERE key_id = '{id}'"
    ));
    assert_eq!(before, after, "the holder's row is unchanged");
    // An expired row is taken over: our token, our expiry.
    db.query(&format!(
        "UPDATE lock_keys SET key_expiration = UNIX_TIMESTAMP() - 5 WHERE key_id = '{id}'"
    ));
    let saved = store.save(&key, TTL).await.unwrap();
    assert!(
        saved.acquired().unwrap().fencing_token.is_some(),
        "a takeover is a new acquisition"
    );
    assert_eq!(db.token_of(&r), Some(key.token("sql")));
}

/// sqlx turns `CLIENT_FOUND_ROWS` on by default, which makes an unchanged row count as
/// affected (a refusal would look like success); without it our own re-save within the same
/// second counts as nothing. The store must answer right either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_answers_do_not_depend_on_found_rows() {
    use std::str::FromStr as _;
    let db = Db::mariadb();
    db.store().create_table().await.unwrap();
    let Db::MariaDb(server) = &db else {
        unreachable!()
    };
    for found_rows in [true, false] {
        let options = sqlx::mysql::MySqlConnectOptions::from_str(&server.url())
            .unwrap()
            .found_rows(found_rows);
        let pool = sqlx::mysql::MySqlPoolOptions::new().connect_lazy_with(options);
        let store = SqlStore::from_mysql_pool(pool);
        let r = unique("found-rows");
        let (a, b) = (Key::new(&r), Key::new(&r));
        let first = store.save(&a, TTL).await.unwrap();
        let token = first.acquired().expect("acquired").fencing_token;
        // Within the same second, values identical: our own re-save, and a refusal.
        let again = store.save(&a, TTL).await.unwrap();
        assert!(
            again.is_acquired(),
            "found_rows={found_rows}: a re-save is ours"
        );
        assert!(
            store.save(&b, TTL).await.unwrap().is_conflict(),
            "found_rows={found_rows}"
        );
        assert_eq!(
            store
                .put_off_expiration(&a, Duration::from_secs(30))
                .await
                .unwrap(),
            Holding::Held(xtr_lock::Mode::Write),
            "found_rows={found_rows}: a refresh within the same second"
        );
        assert!(token.is_some());
        assert!(store.delete(&a).await.unwrap());
    }
}

/// A refused attempt is an ordinary answer, not a duplicate-key error: nothing in the server's
/// log (Symfony's insert-first attempts log an ERROR each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refusals_write_no_errors_to_the_server_log() {
    let db = Db::postgres();
    let store = db.store();
    let r = unique("quiet");
    let (a, b) = (Key::new(&r), Key::new(&r));
    assert!(store.save(&a, TTL).await.unwrap().is_acquired());
    for _ in 0..20 {
        assert!(store.save(&b, TTL).await.unwrap().is_conflict());
    }
    store.delete(&a).await.unwrap();
    let Db::Postgres(server) = &db else {
        unreachable!()
    };
    let log = server.log_text();
    assert!(!log.contains("duplicate key"), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
}

/// The lock is taken on the store's own connections: a transaction open elsewhere neither
/// hides it nor takes it back when rolled back, and its old start time is not our clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_locks_do_not_depend_on_anyones_transaction() {
    let db = Db::postgres();
    let store = db.store();
    let r = unique("tx");
    let Db::Postgres(server) = &db else {
        unreachable!()
    };
    let pool = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_sleep(1.2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let key = Key::new(&r);
    assert!(
        store
            .save(&key, Some(Duration::from_secs(2)))
            .await
            .unwrap()
            .is_acquired()
    );
    // Inside the old transaction (a fresh statement), the row is already there and live.
    let live: bool = sqlx::query_scalar(
        "SELECT key_expiration > CAST(EXTRACT(epoch FROM statement_timestamp()) AS INT) \
         FROM lock_keys WHERE key_id = $1",
    )
    .bind(sql_key_id(&r))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(live, "visible at once, and not born expired");
    tx.rollback().await.unwrap();
    assert!(
        store.exists(&key).await.unwrap().is_held(),
        "a rollback elsewhere does not undo it"
    );
    store.delete(&key).await.unwrap();
}

async fn cancelled_acquires_leave_no_row(db: Db) {
    let store = db.store();
    store.create_table().await.unwrap();
    let factory = LockFactory::new(store.clone()).with_ttl(TTL);
    for i in 0..40u64 {
        let r = unique("cancel");
        let lock = factory.create_lock(&r);
        // Dropped anywhere from before the statement is sent to after it is answered.
        let budget = Duration::from_micros((i * 97) % 4000);
        let _ = tokio::time::timeout(budget, lock.acquire()).await;
        if !lock.is_acquired().await.unwrap() {
            // The clean-up of the dropped acquire runs in the background, after the save: the
            // row must be gone once it has run (bounded by a generous deadline).
            let count = || {
                db.query(&format!(
                    "SELECT count(*) FROM lock_keys WHERE key_id = '{}'",
                    sql_key_id(&r)
                ))
            };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while count() != "0" && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(
                count(),
                "0",
                "dropped after {budget:?}: a row was left behind"
            );
        } else {
            let _ = lock.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cancelled_acquires_leave_no_row() {
    cancelled_acquires_leave_no_row(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_cancelled_acquires_leave_no_row() {
    cancelled_acquires_leave_no_row(Db::mariadb()).await;
}

async fn a_server_killed_mid_hold(mut db: Db) {
    let store = db.store();
    let r = unique("killed");
    let key = Key::new(&r);
    assert!(store.save(&key, TTL).await.unwrap().is_acquired());
    db.kill();
    let err = store
        .put_off_expiration(&key, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Storage, "{err}");
    assert!(err.is_temporary(), "{err}");
    assert!(err.to_string().contains("database"), "{err}");
    db.restart();
    // What was committed survived; the pool reconnects.
    let mut held = None;
    for _ in 0..50 {
        match store.exists(&key).await {
            Ok(h) => {
                held = Some(h);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(held, Some(Holding::Held(xtr_lock::Mode::Write)));
    assert!(store.delete(&key).await.unwrap());
    let other = Key::new(&r);
    assert!(
        store.save(&other, TTL).await.unwrap().is_acquired(),
        "works after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed_mid_hold_is_a_storage_error_then_works_again() {
    a_server_killed_mid_hold(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_killed_mid_hold_is_a_storage_error_then_works_again() {
    a_server_killed_mid_hold(Db::mariadb()).await;
}

#[tokio::test]
async fn a_missing_or_wrong_table_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    std::fs::File::create(&path).unwrap();
    let dsn = format!("sqlite://{}", path.display());
    let store = SqlStore::from_dsn(&dsn).unwrap();
    let err = store.save(&Key::new("r"), TTL).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("lock_keys") && text.contains("migrate"),
        "{text}"
    );
    let wrong = SqlStore::from_dsn(&format!("{dsn}?table=wrong")).unwrap();
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE wrong (key_id TEXT PRIMARY KEY, owner TEXT)")
        .execute(&pool)
        .await
        .unwrap();
    let err = wrong.create_table().await.unwrap_err();
    assert!(
        err.to_string()
            .contains("table wrong has no column key_token"),
        "{err}"
    );
}

/// Expired rows are swept in the background; live rows never are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_rows_are_swept_and_live_ones_kept() {
    let db = Db::postgres();
    let store = db.store().with_sweep_interval(Duration::ZERO);
    store.create_table().await.unwrap();
    db.query(
        "INSERT INTO lock_keys SELECT md5(i::text) || md5(i::text), 'x', \
         CAST(EXTRACT(epoch FROM now()) AS INT) - 10 FROM generate_series(1, 150) i",
    );
    let live = Key::new(unique("live"));
    assert!(store.save(&live, TTL).await.unwrap().is_acquired());
    let count = || db.query("SELECT count(*) FROM lock_keys");
    for _ in 0..100 {
        if count() == "51" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count(), "51", "one sweep takes at most 100 expired rows");
    let other = Key::new(unique("other"));
    assert!(store.save(&other, TTL).await.unwrap().is_acquired());
    for _ in 0..100 {
        if count() == "2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        count(),
        "2",
        "the next sweep takes the rest, never the live rows"
    );
    assert!(store.exists(&live).await.unwrap().is_held());
    assert_eq!(
        store.exists(&Key::new("never")).await.unwrap(),
        Holding::NotHeld(LostReason::Removed)
    );
}
