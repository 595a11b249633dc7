//! Counting semaphores on the SQL table store, on real PostgreSQL and MariaDB servers and on
//! SQLite: the count and the weights, the rows, the limit rule, expiry of a dead holder, a
//! checker under contention, and a paused server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rand::Rng as _;
use xtr_lock::store::sql_key_id;
use xtr_lock::{
    ErrorKind, Key, LockFactory, Lockable as _, Permits, Release, Semaphore, SqlStore, Store as _,
};

use crate::support::symfony_sql::Db;

const TTL: Duration = Duration::from_secs(30);

fn unique(name: &str) -> String {
    format!("sql-sem:{name}:{:08x}", rand::rng().random::<u32>())
}

fn factory(dsn: &str) -> LockFactory {
    LockFactory::new(SqlStore::from_dsn(dsn).unwrap()).with_ttl(TTL)
}

fn sqlite_dsn(dir: &tempfile::TempDir) -> String {
    format!(
        "sqlite://{}?create_table=true",
        dir.path().join("locks.db").display()
    )
}

fn sem(f: &LockFactory, name: &str, limit: u32, count: u32) -> Semaphore {
    f.create_semaphore(name, limit)
        .unwrap()
        .permits(count)
        .unwrap()
}

/// Limit 3: three single permits in, a fourth refused; a release frees one; a holder of two
/// waits for two; a lock of the same name is unrelated; the rows are where the docs say.
async fn counts(dsn: &str, db: Option<&Db>) {
    let f = factory(dsn);
    let r = unique("counts");
    let (a, b, c, d) = (
        sem(&f, &r, 3, 1),
        sem(&f, &r, 3, 1),
        sem(&f, &r, 3, 1),
        sem(&f, &r, 3, 1),
    );
    for s in [&a, &b, &c] {
        assert!(s.try_acquire().await.unwrap());
    }
    assert!(
        !d.try_acquire().await.unwrap(),
        "the fourth permit is refused"
    );
    let usage = d.usage().await.unwrap();
    assert_eq!(
        (usage.used, usage.limit, usage.holders.len()),
        (3, Some(3), 3)
    );
    assert_eq!(d.remaining().await.unwrap(), 0);
    // A lock of the same name is another thing.
    let lock = f.create_lock(&r);
    assert!(
        lock.try_acquire().await.unwrap(),
        "a lock beside the semaphore"
    );
    if let Some(db) = db {
        let id = sql_key_id(&r);
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
            db.token_of(&r),
            Some(lock.key().token("sql")),
            "the lock's own row"
        );
    }
    assert_eq!(lock.release().await.unwrap(), Release::Released);

    // Weights: a holder of two does not fit beside two singles, and fits once one goes.
    assert_eq!(a.release().await.unwrap(), Release::Released);
    let two = sem(&f, &r, 3, 2);
    assert!(!two.try_acquire().await.unwrap(), "two permits, one free");
    assert!(d.try_acquire().await.unwrap(), "the one free permit");
    assert_eq!(b.release().await.unwrap(), Release::Released);
    assert_eq!(c.release().await.unwrap(), Release::Released);
    assert!(two.try_acquire().await.unwrap(), "two free now");
    let held = two.holders().await.unwrap();
    let mut counts: Vec<u32> = held.iter().filter_map(|h| h.permits).collect();
    counts.sort_unstable();
    assert_eq!(counts, [1, 2]);
    // A re-acquire by a holder refreshes: no second row, the count unchanged.
    assert!(two.try_acquire().await.unwrap());
    assert_eq!(two.usage().await.unwrap().used, 3);
    assert!(two.is_acquired().await.unwrap());
    two.refresh(None).await.unwrap();
    // Fencing: each acquisition a larger token.
    let (t1, t2) = (d.fencing_token().unwrap(), two.fencing_token().unwrap());
    assert!(t2 > t1, "{t1} then {t2}");
    assert_eq!(two.release().await.unwrap(), Release::Released);
    assert_eq!(two.release().await.unwrap(), Release::NotHeld);
    assert_eq!(d.release().await.unwrap(), Release::Released);
    let usage = d.usage().await.unwrap();
    assert_eq!((usage.used, usage.limit), (0, None), "nobody holds");
}

/// The stored limit binds while anybody holds, naming both; once nobody holds, the next
/// holder's is the semaphore's.
async fn limit_rule(dsn: &str) {
    let f = factory(dsn);
    let r = unique("limit");
    let three = sem(&f, &r, 3, 1);
    let five = sem(&f, &r, 5, 1);
    assert!(three.try_acquire().await.unwrap());
    let err = five.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let said = err.to_string();
    assert!(
        said.contains("limit of 3") && said.contains("limit of 5"),
        "{said}"
    );
    assert_eq!(three.release().await.unwrap(), Release::Released);
    assert!(five.try_acquire().await.unwrap(), "nobody holds: 5 now");
    assert_eq!(five.usage().await.unwrap().limit, Some(5));
    assert!(three.try_acquire().await.is_err(), "now 3 is the stranger");
    assert_eq!(five.release().await.unwrap(), Release::Released);
}

/// A holder that dies (dropped without a release: its row is stored data) keeps its permits
/// until its ttl, then a waiter gets them.
async fn a_dead_holders_permits_come_back(dsn: &str) {
    let f = factory(dsn);
    let r = unique("dead");
    let short = Duration::from_secs(2);
    let dead = sem(&f, &r, 2, 2).with_ttl(short).with_keep_alive(false);
    assert!(dead.try_acquire().await.unwrap());
    drop(dead);
    let waiter = sem(&f, &r, 2, 1);
    assert!(
        !waiter.try_acquire().await.unwrap(),
        "still held until its ttl"
    );
    assert!(
        waiter
            .acquire_timeout(Duration::from_secs(10))
            .await
            .unwrap(),
        "the dead holder's permits come back at its ttl"
    );
    let usage = waiter.usage().await.unwrap();
    assert_eq!((usage.used, usage.holders.len()), (1, 1));
    assert_eq!(waiter.release().await.unwrap(), Release::Released);
}

/// 8 contenders, each taking 1 to 3 permits of 4 again and again, waiting for them: the
/// permits held at once, counted on our side, never exceed the limit.
async fn checker(dsn: &str) {
    let f = factory(dsn);
    let r = unique("checker");
    let held = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let count = rand::rng().random_range(1..=3);
        let s = sem(&f, &r, 4, count);
        let (held, most) = (held.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                assert!(s.acquire_timeout(Duration::from_secs(60)).await.unwrap());
                let now = held.fetch_add(count, Ordering::SeqCst) + count;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= 4, "{now} permits held at once");
                let seen = s.usage().await.unwrap().used;
                assert!(seen <= 4 && seen >= count, "the store counts {seen}");
                tokio::task::yield_now().await;
                held.fetch_sub(count, Ordering::SeqCst);
                assert_eq!(s.release().await.unwrap(), Release::Released);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=4).contains(&most), "{most}");
    assert_eq!(sem(&f, &r, 4, 1).usage().await.unwrap().used, 0);
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
    let dsn = db.dsn();
    counts(&dsn, Some(db)).await;
    limit_rule(&dsn).await;
    a_dead_holders_permits_come_back(&dsn).await;
    checker(&dsn).await;
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
    let dsn = sqlite_dsn(&dir);
    counts(&dsn, None).await;
    limit_rule(&dsn).await;
    a_dead_holders_permits_come_back(&dsn).await;
    checker(&dsn).await;
}

/// `create_table` makes the semaphores' tables with the others, and a store without them (and
/// without `create_table`) says which is missing and how to make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semaphore_tables_are_made_with_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let bare = SqlStore::from_dsn(&format!("sqlite://{}", path.display())).unwrap();
    assert_eq!(bare.ddl().len(), 4);
    let locks_only = &bare.ddl()[..2];
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
