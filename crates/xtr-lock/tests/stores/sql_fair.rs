//! The SQL table store's fair queue (`<table>_queue`) on real servers: a dead waiter's ticket
//! expires, a cancelled waiter's goes at once, `fair=false` barges, a holder row written by
//! someone who does not know the queue (PHP, raw SQL) still excludes, and a database made
//! before the queue says what to do.

use std::time::Duration;

use xtr_lock::store::sql_key_id;
use xtr_lock::{Key, LockFactory, Lockable as _, SqlStore, Store as _};

use crate::support::symfony_sql::Db;

const TTL: Duration = Duration::from_secs(30);

fn unique(name: &str) -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    format!("sql-fair:{name}:{:08x}", u32::from_le_bytes(b))
}

/// The database's clock in ms, as the queue reads it.
fn ms(db: &Db) -> &'static str {
    match db {
        Db::Postgres(_) => "CAST(EXTRACT(epoch FROM clock_timestamp()) * 1000 AS BIGINT)",
        Db::MariaDb(_) => "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000 AS SIGNED)",
    }
}

/// The database's clock in whole seconds, as the lock table keeps it.
fn seconds(db: &Db) -> &'static str {
    match db {
        Db::Postgres(_) => "CAST(EXTRACT(epoch FROM now()) AS INT)",
        Db::MariaDb(_) => "UNIX_TIMESTAMP()",
    }
}

/// Queues a ticket for `resource` as a waiter of another process would, waiting since the
/// epoch's first microsecond (ahead of everyone), live for `ms` more.
fn foreign_ticket(db: &Db, resource: &str, token: &str, left_ms: u64) {
    let id = sql_key_id(resource);
    db.query(&format!(
        "INSERT INTO lock_keys_queue (q_id, token, since_us, seq, permits, expires_ms) \
         VALUES ('{id}', '{token}', 1, 1, 0, {} + {left_ms})",
        ms(db)
    ));
}

/// One test per database for each scenario below.
macro_rules! on_both {
    ($($scenario:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Db::postgres()).await
                }
            )*
        }
        mod mariadb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::Db::mariadb()).await
                }
            )*
        }
    };
}

on_both!(
    a_dead_waiters_ticket_expires_and_does_not_stall_the_queue,
    a_cancelled_waiter_leaves_the_queue_at_once,
    fair_false_lets_newcomers_barge,
    a_peers_row_still_excludes_a_queued_waiter,
    a_database_made_before_the_queue_is_named_then_migrated,
);

/// Polls `what` until it holds (a condition, not a timing: 60 s is only a bound).
async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    for _ in 0..6000 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 60 s");
}

/// A waiter whose process died leaves a ticket nobody refreshes: it keeps newcomers out while
/// it lives, then expires, and the queue moves on without it.
async fn a_dead_waiters_ticket_expires_and_does_not_stall_the_queue(db: Db) {
    let store = db.store();
    assert!(store.capabilities().fair, "fair by default");
    store.create_table().await.unwrap();
    let r = unique("dead");
    foreign_ticket(&db, &r, "dead-waiter", 3000);
    let expires: i64 = db
        .query("SELECT max(expires_ms) FROM lock_keys_queue")
        .parse()
        .unwrap();
    let factory = LockFactory::new(store.clone()).with_ttl(TTL);
    let lock = factory.create_lock(&r);
    assert!(
        !lock.try_acquire().await.unwrap(),
        "a newcomer does not take a free lock past a live ticket"
    );
    tokio::time::timeout(Duration::from_secs(60), lock.acquire())
        .await
        .expect("the queue moves on once the dead ticket expired")
        .unwrap();
    let now: i64 = db.query(&format!("SELECT {}", ms(&db))).parse().unwrap();
    assert!(
        now >= expires,
        "it got in past the dead ticket's expiry only"
    );
    let _ = lock.release().await.unwrap();
}

/// A waiter whose acquire is dropped takes its ticket out at once (in the background), long
/// before the ticket would have expired.
async fn a_cancelled_waiter_leaves_the_queue_at_once(db: Db) {
    let store = db.store();
    let factory = LockFactory::new(store.clone()).with_ttl(TTL);
    let r = unique("cancel");
    let holder = factory.create_lock(&r);
    holder.acquire().await.unwrap();
    let waiter = factory.create_lock(&r);
    let task = tokio::spawn(async move { waiter.acquire().await });
    let count = || db.query("SELECT count(*) FROM lock_keys_queue");
    until("the waiter's ticket is queued", || count() == "1").await;
    let expires: i64 = db
        .query("SELECT expires_ms FROM lock_keys_queue")
        .parse()
        .unwrap();
    task.abort();
    let _ = task.await;
    until("the cancelled waiter's ticket goes", || count() == "0").await;
    let now: i64 = db.query(&format!("SELECT {}", ms(&db))).parse().unwrap();
    assert!(now < expires, "taken out, not expired");
    let _ = holder.release().await.unwrap();
}

/// `?fair=false` lets a newcomer take a free lock whatever the queue holds; the fair store
/// beside it does not.
async fn fair_false_lets_newcomers_barge(db: Db) {
    let fair = db.store();
    fair.create_table().await.unwrap();
    let barging = SqlStore::from_dsn(&format!("{}&fair=false", db.dsn())).unwrap();
    assert!(!barging.capabilities().fair);
    let r = unique("barge");
    foreign_ticket(&db, &r, "someone-waiting", 60_000);
    let polite = LockFactory::new(fair).with_ttl(TTL).create_lock(&r);
    assert!(
        !polite.try_acquire().await.unwrap(),
        "the fair store queues"
    );
    let rude = LockFactory::new(barging).with_ttl(TTL).create_lock(&r);
    assert!(rude.try_acquire().await.unwrap(), "fair=false barges");
    let _ = rude.release().await.unwrap();
}

/// A holder row written by someone who does not know the queue (a PHP process on Symfony's
/// `PdoStore`, here raw SQL) keeps our queued waiter out: `lock_keys` decides, as ever. Once
/// it goes, the waiter gets in; a renewal of our own row is never kept out by the queue.
async fn a_peers_row_still_excludes_a_queued_waiter(db: Db) {
    let store = db.store();
    store.create_table().await.unwrap();
    let r = unique("peer");
    let id = sql_key_id(&r);
    db.query(&format!(
        "INSERT INTO lock_keys VALUES ('{id}', 'php-holder-token', {} + 60)",
        seconds(&db)
    ));
    let factory = LockFactory::new(store.clone()).with_ttl(TTL);
    let waiter = factory.create_lock(&r);
    let task = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire().await }
    });
    let queued = || db.query("SELECT count(*) FROM lock_keys_queue");
    until("the waiter's ticket is queued", || queued() == "1").await;
    assert!(!task.is_finished(), "the peer's row keeps the waiter out");
    assert_eq!(db.token_of(&r).as_deref(), Some("php-holder-token"));
    db.query(&format!("DELETE FROM lock_keys WHERE key_id = '{id}'"));
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("the waiter gets in once the peer's row went")
        .unwrap()
        .unwrap();
    // A later waiter queues behind the holder; the holder's renewal is not kept out.
    foreign_ticket(&db, &r, "someone-waiting", 60_000);
    assert!(
        store
            .put_off_expiration(waiter.key(), TTL)
            .await
            .unwrap()
            .is_held()
    );
    assert!(
        store
            .save(waiter.key(), Some(TTL))
            .await
            .unwrap()
            .is_acquired()
    );
    let _ = waiter.release().await.unwrap();
}

/// A database made before the queue (lock, fencing and record tables only): a fair store says
/// in one line to migrate (or to opt out), `fair=false` works on it as it is, and migrating adds
/// the queue beside the tables that were there. `dsn` has no options.
async fn made_before_the_queue(dsn: &str) {
    let old = SqlStore::from_dsn(&format!("{dsn}?create_table=true&fair=false")).unwrap();
    assert!(old.create_table().await.unwrap(), "the older tables made");
    let fair = SqlStore::from_dsn(dsn).unwrap();
    assert!(fair.capabilities().fair, "fair by default");
    let err = fair.save(&Key::new("r"), Some(TTL)).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("lock_keys_queue")
            && text.contains("xtr-lock migrate")
            && text.contains("fair=false")
            && !text.contains('\n'),
        "{text}"
    );
    let unfair = LockFactory::new(SqlStore::from_dsn(&format!("{dsn}?fair=false")).unwrap())
        .with_ttl(TTL)
        .create_lock("r");
    assert!(
        unfair.try_acquire().await.unwrap(),
        "fair=false needs no queue"
    );
    let _ = unfair.release().await.unwrap();
    assert!(fair.create_table().await.unwrap(), "migrate adds the queue");
    assert!(
        !fair.create_table().await.unwrap(),
        "and then has nothing to do"
    );
    let lock = LockFactory::new(fair).with_ttl(TTL).create_lock("r");
    assert!(lock.try_acquire().await.unwrap());
    let _ = lock.release().await.unwrap();
}

#[tokio::test]
async fn a_database_made_before_the_queue_is_migrated_or_named() {
    let dir = tempfile::tempdir().unwrap();
    made_before_the_queue(&format!(
        "sqlite://{}",
        dir.path().join("locks.db").display()
    ))
    .await;
}

/// The same on a server.
async fn a_database_made_before_the_queue_is_named_then_migrated(db: Db) {
    made_before_the_queue(&db.url()).await;
}
