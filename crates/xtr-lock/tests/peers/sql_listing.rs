//! Holder records and listing of the SQL table store beside Symfony Lock's `PdoStore` (PHP) on
//! one database, PostgreSQL and MariaDB: Symfony's holders are listed (by exact name, or by
//! their row's hash), Symfony acquires, refreshes and releases as before while our records
//! exist, and a record never outlives its lock.

use std::time::Duration;

use xtr_lock::store::HolderInfo;
use xtr_lock::{LockFactory, Lockable as _, Mode, Store as _};

use crate::support::symfony_sql::{Db, Holder, on_both};

fn unique(name: &str) -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    format!("sql-list:{name}:{:08x}", u32::from_le_bytes(b))
}

fn factory(db: &Db) -> LockFactory {
    LockFactory::new(db.store()).with_ttl(Some(Duration::from_secs(30)))
}

/// The rows of our records' table for `resource`'s lock.
fn records_of(db: &Db, resource: &str) -> String {
    let id = xtr_lock::store::sql_key_id(resource);
    db.query(&format!(
        "SELECT COUNT(*) FROM lock_keys_holder WHERE key_id = '{id}'"
    ))
}

/// A Symfony holder is listed with its token and expiry: under its name when the prefix is the
/// name, under `sha256:<key_id>` in the whole listing; our holder beside it with its metadata.
async fn a_symfony_holder_is_listed(db: Db) {
    let (theirs, ours) = (unique("php"), unique("rust"));
    let lock = factory(&db)
        .create_lock(&ours)
        .with_meta(b"host=a".to_vec())
        .unwrap();
    assert!(lock.try_acquire().await.unwrap());
    let mut php = Holder::start(&db, &theirs, 60.0, &["--ttl=30"]);
    php.until("ACQUIRED").await;
    let token = php.until("TOKEN").await.get("token").to_owned();
    let store = db.store();

    let named = store.list(&theirs).await.unwrap();
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(named[0].resource, theirs);
    let h = &named[0].holders[0];
    let digest = HolderInfo::new(Mode::Write, None, None)
        .with_token(&token)
        .id;
    assert_eq!(h.id, digest, "the token's digest: {h:?}");
    assert!(h.remaining.unwrap() <= Duration::from_secs(30), "{h:?}");
    assert_eq!((h.meta.as_ref(), h.acquired_at), (None, None), "{h:?}");

    let all = store.list("").await.unwrap();
    let hashed = format!("sha256:{}", xtr_lock::store::sql_key_id(&theirs));
    let found: Vec<&str> = all.iter().map(|l| l.resource.as_str()).collect();
    assert!(found.contains(&hashed.as_str()), "{found:?}");
    assert!(found.contains(&ours.as_str()), "{found:?}");
    let mine = all.iter().find(|l| l.resource == ours).unwrap();
    assert_eq!(mine.holders[0].meta.as_deref(), Some(&b"host=a"[..]));
    assert!(mine.holders[0].fencing_token.is_some(), "{mine:?}");
    php.term();
    php.until("RELEASED").await;
    assert!(store.list(&theirs).await.unwrap().is_empty());
    let _ = lock.release().await.unwrap();
}

/// Symfony acquires, refreshes and releases a resource as before while our records of it (and
/// of others) exist; a Symfony holder that took over an expired row of ours shows no record of
/// ours.
async fn symfony_works_beside_our_records(db: Db) {
    let r = unique("beside");
    let store = db.store();
    let short = LockFactory::new(store.clone())
        .with_ttl(Some(Duration::from_secs(2)))
        .create_lock(&r)
        .with_keep_alive(false)
        .with_meta(b"ours".to_vec())
        .unwrap();
    assert!(short.try_acquire().await.unwrap());
    assert_eq!(records_of(&db, &r), "1");
    // Symfony waits for our row to expire, takes it over, refreshes and releases.
    let mut php = Holder::start(&db, &r, 3.0, &["--timeout=15", "--ttl=2", "--refresh=0.5"]);
    php.until("ACQUIRED").await;
    php.until("REFRESHED").await;
    let holders = store.holders(&r).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(
        holders[0].meta, None,
        "our expired record is not Symfony's: {holders:?}"
    );
    let listed = store.list(&r).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].holders[0].meta, None, "{listed:?}");
    php.until("RELEASED").await;
    assert_eq!(php.exit_code().await, 0);
    // And again, from nothing, while a record of ours for another resource exists.
    let other = factory(&db)
        .create_lock(unique("other"))
        .with_meta(b"x".to_vec())
        .unwrap();
    assert!(other.try_acquire().await.unwrap());
    let mut php = Holder::start(&db, &r, 1.5, &["--try", "--ttl=2", "--refresh=0.5"]);
    php.until("REFRESHED").await;
    php.until("RELEASED").await;
    assert_eq!(php.exit_code().await, 0);
    let _ = other.release().await.unwrap();
}

/// A record goes with its lock: in the releasing statement, and once expired it is shown by
/// nobody (and the sweep removes it).
async fn records_never_outlive_their_lock(db: Db) {
    let r = unique("outlive");
    let store = db.store().with_sweep_interval(Duration::ZERO);
    let f = LockFactory::new(store.clone()).with_ttl(Some(Duration::from_secs(30)));
    let lock = f.create_lock(&r).with_meta(b"m".to_vec()).unwrap();
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(records_of(&db, &r), "1");
    let _ = lock.release().await.unwrap();
    assert_eq!(records_of(&db, &r), "0", "deleted with the row");

    let expiring = LockFactory::new(store.clone())
        .with_ttl(Some(Duration::from_secs(2)))
        .create_lock(&r)
        .with_keep_alive(false)
        .with_meta(b"m".to_vec())
        .unwrap();
    assert!(expiring.try_acquire().await.unwrap());
    tokio::time::sleep(Duration::from_millis(2600)).await;
    assert!(store.holders(&r).await.unwrap().is_empty());
    assert!(store.list(&r).await.unwrap().is_empty());
    // Expired for more than a second: the next acquisition's sweep takes the row and then
    // the record.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let other = f.create_lock(unique("sweeper"));
    assert!(other.try_acquire().await.unwrap());
    let swept = async {
        while records_of(&db, &r) != "0" {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Each sweep takes the expired rows first, the records of rows gone next time.
            let again = f.create_lock(unique("sweeper"));
            assert!(again.try_acquire().await.unwrap());
            let _ = again.release().await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(20), swept)
        .await
        .expect("the record is swept");
    let _ = other.release().await.unwrap();
}

/// A re-save replaces the metadata and keeps the acquisition time (MySQL writes the record
/// again only because the metadata changed).
async fn a_resave_replaces_the_metadata_and_keeps_the_time(db: Db) {
    let r = unique("resave");
    let store = db.store();
    let lock = factory(&db)
        .create_lock(&r)
        .with_meta(b"one".to_vec())
        .unwrap();
    assert!(lock.try_acquire().await.unwrap());
    let first = store.holders(&r).await.unwrap();
    assert_eq!(first[0].meta.as_deref(), Some(&b"one"[..]), "{first:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    lock.key().set_meta(Some(b"two".to_vec())).unwrap();
    assert!(lock.try_acquire().await.unwrap(), "a re-save");
    let second = store.holders(&r).await.unwrap();
    assert_eq!(second[0].meta.as_deref(), Some(&b"two"[..]), "{second:?}");
    assert_eq!(second[0].acquired_at, first[0].acquired_at);
    assert_eq!(second[0].fencing_token, first[0].fencing_token);
    let _ = lock.release().await.unwrap();
}

on_both!(
    a_symfony_holder_is_listed,
    symfony_works_beside_our_records,
    records_never_outlive_their_lock,
    a_resave_replaces_the_metadata_and_keeps_the_time,
);
