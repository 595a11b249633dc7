//! A transaction of the table store that the database rolls back to break a deadlock goes
//! again: the caller never sees the deadlock, and a release still releases.

use std::str::FromStr as _;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use xtr_lock::store::sql_key_id;
use xtr_lock::{LockFactory, Release, SqlStore};

use super::sem_common::{sem, unique};
use crate::support::symfony_sql::Db;

async fn exec(conn: &mut MySqlConnection, sql: &str) -> sqlx::Result<u64> {
    let done = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(conn).await?;
    Ok(done.rows_affected())
}

/// The number of rows a locking read returns.
async fn rows(conn: &mut MySqlConnection, sql: &str) -> sqlx::Result<usize> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(conn)
        .await?;
    Ok(rows.len())
}

/// A permit's release picked as the victim of a deadlock: another transaction, heavier (it
/// inserted many rows, so InnoDB keeps it), holds the holder's record row while the release,
/// having deleted the permit's row, waits for it; then asks for the permit's row. InnoDB rolls
/// the release back; the release goes again once the other commits, and the permit is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_rolled_back_by_a_deadlock_goes_again() {
    let db = Db::mariadb();
    let Db::MariaDb(server) = &db else {
        unreachable!()
    };
    let f = LockFactory::new(SqlStore::from_dsn(&db.dsn()).unwrap());
    let r = unique("deadlock");
    let (a, b) = (sem(&f, &r, 1, 1), sem(&f, &r, 1, 1));
    assert!(a.try_acquire().await.unwrap());
    let id = sql_key_id(&r);

    let options = MySqlConnectOptions::from_str(&server.url()).unwrap();
    let mut other = MySqlConnection::connect_with(&options).await.unwrap();
    exec(
        &mut other,
        "CREATE TABLE IF NOT EXISTS heavy (n INT) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    exec(&mut other, "BEGIN").await.unwrap();
    let heavy = "INSERT INTO heavy (n) WITH RECURSIVE s(n) AS \
                 (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 1000) SELECT n FROM s";
    for _ in 0..5 {
        assert_eq!(exec(&mut other, heavy).await.unwrap(), 1000);
    }
    let record = format!("SELECT * FROM lock_keys_holder WHERE key_id = 's:{id}' FOR UPDATE");
    assert_eq!(
        rows(&mut other, &record).await.unwrap(),
        1,
        "the holder's record row exists, and the other transaction holds it"
    );

    let release = tokio::spawn(async move { a.release().await });
    // The release deletes the permit's row, then waits for the record's.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !release.is_finished(),
        "the release waits for the record's row"
    );
    let permit = format!("SELECT * FROM lock_keys_perm WHERE sem_id = '{id}' FOR UPDATE");
    rows(&mut other, &permit)
        .await
        .expect("the heavier transaction survives the deadlock: the release is its victim");
    tokio::time::sleep(Duration::from_millis(100)).await;
    exec(&mut other, "COMMIT").await.unwrap();

    let released = release.await.unwrap();
    assert_eq!(
        released.unwrap(),
        Release::Released,
        "the release went again"
    );
    assert!(b.try_acquire().await.unwrap(), "the permit is free");
    assert_eq!(b.release().await.unwrap(), Release::Released);
}
