//! The SQL table store and Symfony Lock's `PdoStore` (PHP) on one database exclude each other,
//! both ways, on PostgreSQL and MariaDB: holds, refusals, takeovers of expired rows, mixed
//! contention. The PHP side is `tests/peers/symfony_holder.php`.

use std::sync::Arc;
use std::time::Duration;

use xtr_lock::store::{Holding, LostReason};
use xtr_lock::{Key, LockFactory, Lockable as _, Release, Store as _};

use crate::support::symfony_sql::{Db, Holder, on_both};

fn unique(name: &str) -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    format!("sql-peer:{name}:{:08x}", u32::from_le_bytes(b))
}

fn factory(db: &Db) -> LockFactory {
    LockFactory::new(db.store()).with_ttl(Some(Duration::from_secs(30)))
}

async fn symfony_holds_then_rust_takes(db: Db) {
    let r = unique("php-holds");
    let lock = factory(&db).create_lock(&r);
    // Any resource name: the row is the SHA-256 of its bytes on both sides.
    let mut php = Holder::start(&db, &r, 60.0, &["--ttl=30"]);
    let info = php.until("INFO").await;
    assert_eq!(info.get("pdo_key_id"), xtr_lock::store::sql_key_id(&r));
    php.until("ACQUIRED").await;
    let token = php.until("TOKEN").await.get("token").to_owned();
    assert_eq!(
        db.token_of(&r).as_deref(),
        Some(token.as_str()),
        "the row is Symfony's"
    );
    assert!(!lock.try_acquire().await.unwrap(), "Symfony holds it");
    let holders = db.store().holders(&r).await.unwrap();
    assert_eq!(holders.len(), 1);
    assert!(holders[0].remaining.unwrap() <= Duration::from_secs(30));
    php.term();
    php.until("RELEASED").await;
    assert_eq!(php.exit_code().await, 0);
    assert!(
        lock.try_acquire().await.unwrap(),
        "free once Symfony released"
    );
    assert_eq!(lock.release().await.unwrap(), Release::Released);
}

async fn rust_holds_and_symfony_is_refused(db: Db) {
    let r = unique("rust-holds");
    let lock = factory(&db).create_lock(&r);
    assert!(lock.try_acquire().await.unwrap());
    let mut php = Holder::start(&db, &r, 1.0, &["--try", "--ttl=30"]);
    php.until("BUSY").await;
    assert_eq!(php.exit_code().await, 1);
    let mut php = Holder::start(&db, &r, 1.0, &["--timeout=0.5", "--ttl=30"]);
    php.until("TIMEOUT").await;
    assert_eq!(php.exit_code().await, 1);
    assert!(
        lock.is_acquired().await.unwrap(),
        "and the refusals changed nothing"
    );
    let _ = lock.release().await.unwrap();
    let mut php = Holder::start(&db, &r, 0.1, &["--try", "--ttl=30"]);
    php.until("RELEASED").await;
    assert_eq!(php.exit_code().await, 0);
}

/// A Symfony row that expired is taken over by Rust; Symfony's later release (token-scoped)
/// leaves the Rust row, and its next refresh reports the loss.
async fn rust_takes_over_an_expired_symfony_row(db: Db) {
    let r = unique("php-expires");
    let mut php = Holder::start(&db, &r, 12.0, &["--ttl=2", "--refresh=5"]);
    php.until("ACQUIRED").await;
    let lock = factory(&db).create_lock(&r);
    // Symfony's row says 2 s (whole seconds): a waiter gets it when it expires, not before.
    assert!(!lock.try_acquire().await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), lock.acquire())
        .await
        .expect("the expired row is taken over")
        .unwrap();
    let ours = Key::from_json(&lock.key().to_json().unwrap()).unwrap();
    assert_eq!(db.token_of(&r), Some(ours.token("sql")));
    php.until("LOST").await;
    assert_eq!(php.exit_code().await, 1);
    assert!(lock.is_acquired().await.unwrap(), "the Rust row stays");
    let _ = lock.release().await.unwrap();
}

/// A Rust row that expired (its holder stopped renewing) is taken over by Symfony; the Rust
/// holder is told it lost the lock.
async fn symfony_takes_over_an_expired_rust_row(db: Db) {
    let r = unique("rust-expires");
    let store = db.store();
    let key = Key::new(&r);
    assert!(
        store
            .save(&key, Some(Duration::from_secs(2)))
            .await
            .unwrap()
            .is_acquired()
    );
    let mut php = Holder::start(&db, &r, 2.0, &["--timeout=10", "--ttl=30"]);
    php.until("ACQUIRED").await;
    let token = php.until("TOKEN").await.get("token").to_owned();
    assert_eq!(db.token_of(&r), Some(token));
    assert_eq!(
        store.exists(&key).await.unwrap(),
        Holding::NotHeld(LostReason::TakenOver)
    );
    assert!(
        !store.delete(&key).await.unwrap(),
        "a release after a takeover is a loss"
    );
    assert!(db.token_of(&r).is_some(), "and leaves Symfony's row");
    php.until("RELEASED").await;
}

/// Two Rust loops and two PHP loops on one resource: whoever holds creates a marker file with
/// O_EXCL and removes it before releasing; nobody ever finds another's marker.
async fn mixed_contention_never_overlaps(db: Db) {
    let r = unique("mixed");
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("occupant");
    let occupy = format!("--occupy={}", marker.display());
    // Two PHP holders making the table at once race each other (Symfony's own): make it first.
    db.store().create_table().await.unwrap();
    let mut phps: Vec<Holder> = (0..2)
        .map(|_| {
            Holder::start(
                &db,
                &r,
                0.02,
                &["--timeout=60", "--ttl=10", "--repeat=15", &occupy],
            )
        })
        .collect();
    let factory = Arc::new(factory(&db));
    let mut rust = Vec::new();
    for i in 0..2 {
        let (factory, marker, r) = (factory.clone(), marker.clone(), r.clone());
        rust.push(tokio::spawn(async move {
            for _ in 0..15 {
                let lock = factory.create_lock(&r);
                tokio::time::timeout(Duration::from_secs(60), lock.acquire())
                    .await
                    .expect("a turn within 60 s")
                    .unwrap();
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&marker)
                    .unwrap_or_else(|e| panic!("rust {i} found the marker of another holder: {e}"));
                tokio::time::sleep(Duration::from_millis(20)).await;
                std::fs::remove_file(&marker).unwrap();
                assert_eq!(lock.release().await.unwrap(), Release::Released);
            }
        }));
    }
    for task in rust {
        task.await.unwrap();
    }
    for php in &mut phps {
        php.until_count("RELEASED", 15).await;
        assert!(
            php.seen.iter().all(|e| e.event != "OVERLAP"),
            "a PHP holder found another holder's marker: {:?}",
            php.seen
        );
    }
    for php in phps {
        assert_eq!(php.exit_code().await, 0);
    }
}

/// A table Symfony made (lazily, on its first insert) is used as it is: the migration adds only
/// our own tables (the fencing table, the holders' records).
async fn a_table_symfony_made_is_used_as_it_is(db: Db) {
    let r = unique("symfony-table");
    let mut php = Holder::start(&db, &r, 0.1, &["--ttl=30"]);
    php.until("RELEASED").await;
    assert_eq!(php.exit_code().await, 0);
    let dsn = db.dsn().replace("create_table=true", "create_table=false");
    let store = xtr_lock::SqlStore::from_dsn(&dsn).unwrap();
    let err = store
        .save(&Key::new(&r), Some(Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("lock_keys_fence") && err.to_string().contains("migrate"),
        "{err}"
    );
    assert!(
        store.create_table().await.unwrap(),
        "the fencing table was made"
    );
    assert!(!store.create_table().await.unwrap(), "and only once");
    let lock = LockFactory::new(store)
        .create_lock(&r)
        .with_ttl(Some(Duration::from_secs(30)));
    assert!(lock.try_acquire().await.unwrap());
    assert!(lock.fencing_token().is_some());
    let _ = lock.release().await.unwrap();
}

on_both!(
    symfony_holds_then_rust_takes,
    rust_holds_and_symfony_is_refused,
    rust_takes_over_an_expired_symfony_row,
    symfony_takes_over_an_expired_rust_row,
    mixed_contention_never_overlaps,
    a_table_symfony_made_is_used_as_it_is,
);
