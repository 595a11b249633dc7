//! A transaction of the table store that the database rolls back to break a deadlock goes
//! again: the caller never sees the deadlock, and a release still releases.

use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use xtr_lock::store::sql_key_id;
use xtr_lock::{LockFactory, Release, SqlStore, Store as _};

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

/// InnoDB's count of deadlocks it broke since the server started.
fn deadlocks(db: &Db) -> u64 {
    let out = db.query("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'");
    let (_, n) = out.split_once('\t').expect("name and value");
    n.trim().parse().unwrap()
}

/// Counts a holder of `name` in for a moment: never more than `most` at once.
async fn hold(held: &AtomicU32, most: u32, name: &str) {
    let now = held.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(now <= most, "{now} holders of {name} at once");
    tokio::time::sleep(Duration::from_millis(2)).await;
    held.fetch_sub(1, Ordering::SeqCst);
}

/// The fair queue under contention on MariaDB: 16 tasks on two stores (two pools, as two
/// processes) take three locks and a semaphore of two permits in random order, waiting for
/// them, again and again. Every acquire and release succeeds, the locks exclude and the
/// semaphore counts (on our side), waiters queue (tickets seen), and InnoDB broke no deadlock:
/// the look before a lock's save holds no lock, and each statement locks rows of one table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fair_queue_under_contention_deadlocks_nowhere() {
    use xtr_lock::Lockable as _;

    let db = Db::mariadb();
    let stores: Vec<_> = (0..2).map(|_| db.store()).collect();
    assert!(stores[0].capabilities().fair);
    stores[0].create_table().await.unwrap();
    let before = deadlocks(&db);
    let names: Vec<String> = (0..4).map(|i| unique(&format!("stress{i}"))).collect();
    let held: Arc<Vec<AtomicU32>> = Arc::new((0..4).map(|_| AtomicU32::new(0)).collect());
    let mut tasks = Vec::new();
    for t in 0..16 {
        let f = LockFactory::new(stores[t % 2].clone()).with_ttl(Duration::from_secs(30));
        let (names, held) = (names.clone(), held.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..12 {
                let i = (t * 7 + round * 3) % 4;
                let wait = Duration::from_secs(120);
                if i == 3 {
                    let s = sem(&f, &names[i], 2, 1);
                    let got = s.acquire_timeout(wait).await.expect("no error");
                    assert!(got, "acquired in time");
                    hold(&held[i], 2, &names[i]).await;
                    assert_eq!(s.release().await.expect("no error"), Release::Released);
                } else {
                    let lock = f.create_lock(&names[i]);
                    let got = lock.acquire_timeout(wait).await.expect("no error");
                    assert!(got, "acquired in time");
                    hold(&held[i], 1, &names[i]).await;
                    assert_eq!(lock.release().await.expect("no error"), Release::Released);
                }
            }
        }));
    }
    let mut most_tickets = 0;
    while !tasks.iter().all(|t| t.is_finished()) {
        let n: u64 = db
            .query("SELECT count(*) FROM lock_keys_queue")
            .parse()
            .unwrap();
        most_tickets = most_tickets.max(n);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        most_tickets >= 2,
        "waiters queued ({most_tickets} tickets at most)"
    );
    assert_eq!(
        deadlocks(&db),
        before,
        "InnoDB broke no deadlock: {}",
        db.query("SHOW ENGINE INNODB STATUS").replace("\\n", "\n")
    );
}
