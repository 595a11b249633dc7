//! Counting semaphores on the SQL table store, on real PostgreSQL and MariaDB servers and on
//! SQLite: the count and the weights, the rows, the limit rule, expiry of a dead holder, a
//! checker under contention, and a paused server.

use std::time::Duration;

use xtr_lock::store::sql_key_id;
use xtr_lock::{Key, Lock, LockFactory, Lockable as _, Permits, Release, SqlStore, Store as _};

use super::sem_common::{
    a_dead_holders_permits_come_back, checker, counts, limit_rule, sem, unique,
};
use crate::support::symfony_sql::Db;

const TTL: Duration = Duration::from_secs(30);

fn factory(dsn: &str) -> LockFactory {
    LockFactory::new(SqlStore::from_dsn(dsn).unwrap()).with_ttl(TTL)
}

fn sqlite_dsn(dir: &tempfile::TempDir) -> String {
    format!(
        "sqlite://{}?create_table=true",
        dir.path().join("locks.db").display()
    )
}

/// The rows while three holders of one permit and a lock of the same name hold: the holders in
/// `lock_keys_perm`, the limit in `lock_keys_sem`, the lock's own row in `lock_keys`.
async fn rows(db: &Db, lock: &Lock) {
    let r = lock.resource();
    let id = sql_key_id(r);
    let rows = db.query(&format!(
        "SELECT COUNT(*), SUM(permits) FROM lock_keys_perm WHERE sem_id = '{id}'"
    ));
    let rows: Vec<&str> = rows
        .split(|c: char| c == '|' || c.is_whitespace())
        .collect();
    assert_eq!(rows, ["3", "3"], "count and sum of the holder rows");
    let limit = db.query(&format!(
        "SELECT sem_limit FROM lock_keys_sem WHERE sem_id = '{id}'"
    ));
    assert_eq!(limit, "3");
    assert_eq!(
        db.token_of(r),
        Some(lock.key().token("sql")),
        "the lock's own row"
    );
}

/// A server paused (SIGSTOP) under an attempt: the attempt fails within the statement timeout,
/// and once the server is back, nothing of it is held; the holder from before still holds.
async fn paused(db: &Db) {
    let f = factory(&format!("{}&statement_timeout=1", db.dsn()));
    let r = unique("paused");
    let (a, b) = (sem(&f, &r, 2, 1), sem(&f, &r, 2, 1));
    assert!(a.try_acquire().await.unwrap());
    db.pause();
    let err = b.try_acquire().await.unwrap_err();
    db.resume();
    assert!(err.is_temporary(), "{err}");
    // The holder's next call runs after its clean-up of the attempt.
    let _ = b.release().await.unwrap();
    let usage = a.usage().await.unwrap();
    assert_eq!((usage.used, usage.holders.len()), (1, 1), "{usage:?}");
    assert_eq!(
        usage.holders[0].id.as_deref(),
        a.key().holder_id("sql").as_deref()
    );
    assert!(b.try_acquire().await.unwrap(), "the free permit is free");
    assert_eq!(a.release().await.unwrap(), Release::Released);
    assert_eq!(b.release().await.unwrap(), Release::Released);
}

async fn all(db: &Db) {
    let f = factory(&db.dsn());
    counts(&f, &unique("counts"), async |lock| rows(db, lock).await).await;
    limit_rule(&f, &unique("limit")).await;
    a_dead_holders_permits_come_back(&f, &unique("dead")).await;
    checker(&f, &unique("checker")).await;
    paused(db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_semaphores() {
    all(&Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_semaphores() {
    all(&Db::mariadb()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_semaphores() {
    let dir = tempfile::tempdir().unwrap();
    let f = factory(&sqlite_dsn(&dir));
    counts(&f, &unique("counts"), async |_| {}).await;
    limit_rule(&f, &unique("limit")).await;
    a_dead_holders_permits_come_back(&f, &unique("dead")).await;
    checker(&f, &unique("checker")).await;
}

/// `create_table` makes the semaphores' tables with the others, and a store without them (and
/// without `create_table`) says which is missing and how to make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semaphore_tables_are_made_with_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let bare = SqlStore::from_dsn(&format!("sqlite://{}", path.display())).unwrap();
    assert_eq!(bare.ddl().len(), 6);
    // The lock table, the fencing table, the holders' records, the fair queue.
    let locks_only = &bare.ddl()[..4];
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    for ddl in locks_only {
        sqlx::query(sqlx::AssertSqlSafe(ddl.as_str()))
            .execute(&pool)
            .await
            .unwrap();
    }
    let f = LockFactory::new(bare.clone()).with_ttl(TTL);
    let lock = f.create_lock("x");
    assert!(
        lock.try_acquire().await.unwrap(),
        "locks need no semaphore tables"
    );
    let key = Key::for_semaphore("x", Permits::new(2, 1).unwrap());
    let err = bare.save(&key, Some(TTL)).await.unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains("t_sem") || said.contains("lock_keys_sem"),
        "{said}"
    );
    assert!(said.contains("xtr-lock migrate"), "{said}");
    assert!(
        bare.create_table().await.unwrap(),
        "made the semaphores' tables"
    );
    assert!(!bare.create_table().await.unwrap(), "and only once");
}
