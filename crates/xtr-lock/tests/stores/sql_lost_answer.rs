//! A new acquisition on the SQL table store always carries a fencing token larger than every
//! earlier one, also when its statement landed and the answer was lost with its connection:
//! the store runs the statement again on a fresh connection, which finds the row already this
//! holder's (a re-save, which draws nothing) while the token the first run drew, if it drew
//! one, never came back. The same holder acquiring again after its row expired unseen (and
//! another held in between) used to be taken for a re-save of a live hold, and got no token;
//! so did one whose earlier attempt was given up on at its time limit and landed late.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use xtr_lock::store::Saved;
use xtr_lock::{Key, LockFactory, Lockable as _, SqlStore, Store};
use xtr_lock_testkit::hook_proxy::{HeldRequest, LostAnswer};

use crate::support::symfony_sql::Db;

/// A store reaching `db` through a proxy that loses the answer to the first statement naming
/// `id` once `armed` is set.
fn cut_off_store(db: &Db, id: String, armed: Arc<AtomicBool>) -> (SqlStore, LostAnswer) {
    let (proxy, lost) = LostAnswer::start(db.port(), move |_, chunk| {
        armed.load(Ordering::Acquire) && chunk.windows(id.len()).any(|w| w == id.as_bytes())
    });
    let store = SqlStore::from_dsn(&format!("{}?statement_timeout=5", via(db, proxy))).unwrap();
    (store, lost)
}

/// `db`'s URL through the proxy on `proxy`.
fn via(db: &Db, proxy: u16) -> String {
    db.url()
        .replace(&format!(":{}/", db.port()), &format!(":{proxy}/"))
}

/// The lifetime of every lock here: rows are taken up to 1 s early, so they expire within 1–2 s.
const TTL: Option<Duration> = Some(Duration::from_secs(2));

fn token(saved: Saved) -> Option<u64> {
    match saved {
        Saved::Acquired(acquired) => acquired.fencing_token,
        Saved::Conflict(_) => panic!("refused"),
    }
}

/// `step`: how many tokens the acquisition drew, the lost one included (PostgreSQL draws in the
/// statement whose answer is lost, MySQL in a second one that was never sent).
async fn an_acquisition_whose_answer_was_lost_has_a_larger_token(db: Db, step: u64) {
    let resource = "lost-answer";
    let direct = LockFactory::new(db.store());
    let first = direct.create_lock(resource);
    assert!(first.try_acquire().await.unwrap());
    let before = first.fencing_token().expect("the table store fences");
    // The resource's id is bound to every statement about it: the first to carry it through
    // the proxy (not its preparation, which names no resource) is the acquisition's.
    let id = db.query("SELECT key_id FROM lock_keys");
    assert_eq!(id.len(), 64, "one row: {id:?}");
    let _ = first.release().await.unwrap();

    let (store, lost) = cut_off_store(&db, id, Arc::new(AtomicBool::new(true)));
    let cut_off = LockFactory::new(store);
    let second = cut_off.create_lock(resource);
    assert!(
        second.try_acquire().await.unwrap(),
        "the acquisition landed"
    );
    assert!(lost.cut_at().is_some(), "the acquisition's answer was lost");
    let after = second.fencing_token();
    assert_eq!(
        after,
        Some(before + step),
        "a new acquisition after {before}"
    );
    let _ = second.release().await.unwrap();
    assert!(
        direct.create_lock(resource).try_acquire().await.unwrap(),
        "released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_acquisition_whose_answer_was_lost_has_a_larger_token() {
    an_acquisition_whose_answer_was_lost_has_a_larger_token(Db::postgres(), 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_an_acquisition_whose_answer_was_lost_has_a_larger_token() {
    an_acquisition_whose_answer_was_lost_has_a_larger_token(Db::mariadb(), 1).await;
}

/// The `key_id` the database stores for `resource` (from a row made and removed here).
async fn key_id_of(db: &Db, resource: &str) -> String {
    let direct = db.store();
    let seed = Key::new(resource);
    assert!(direct.save(&seed, TTL).await.unwrap().is_acquired());
    let id = db.query("SELECT key_id FROM lock_keys");
    assert_eq!(id.len(), 64, "one row: {id:?}");
    assert!(direct.delete(&seed).await.unwrap());
    id
}

/// `key` holds through `store` and lets its row expire without being told; meanwhile another
/// holder takes the lock (as soon as the row is free) and lets go. Its own token, and the
/// other's.
async fn hold_then_expire_unseen(db: &Db, store: &SqlStore, key: &Key) -> (u64, u64) {
    let first = token(store.save(key, TTL).await.unwrap()).expect("a token");
    let direct = db.store();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let other = Key::new(key.resource());
    let between = loop {
        other.reset_lifetime();
        match direct.save(&other, TTL).await.unwrap() {
            Saved::Acquired(acquired) => break acquired.fencing_token.expect("a token"),
            Saved::Conflict(_) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the row never expired"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(between > first);
    assert!(direct.delete(&other).await.unwrap());
    // A new acquisition next: the lock starts its lifetime afresh, as `Lock::acquire` does.
    key.reset_lifetime();
    (first, between)
}

/// A holder whose row expired without its knowing (no renewal), while another held and let go,
/// acquires again; the answer is lost and the rerun finds the row its first run wrote.
async fn a_reacquisition_after_an_unseen_expiry_has_a_larger_token(db: Db) {
    let resource = "lost-answer:expired";
    let id = key_id_of(&db, resource).await;
    let armed = Arc::new(AtomicBool::new(false));
    let (store, lost) = cut_off_store(&db, id, armed.clone());
    let key = Key::new(resource);
    let (first, between) = hold_then_expire_unseen(&db, &store, &key).await;

    armed.store(true, Ordering::Release);
    let again = token(store.save(&key, TTL).await.unwrap());
    assert!(lost.cut_at().is_some(), "the acquisition's answer was lost");
    assert!(
        again.is_some_and(|t| t > between),
        "acquired again after {between} (its own first hold {first}), got {again:?}"
    );
    assert!(store.delete(&key).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_reacquisition_after_an_unseen_expiry_has_a_larger_token() {
    a_reacquisition_after_an_unseen_expiry_has_a_larger_token(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_reacquisition_after_an_unseen_expiry_has_a_larger_token() {
    a_reacquisition_after_an_unseen_expiry_has_a_larger_token(Db::mariadb()).await;
}

/// As above, but the attempt that lands is one given up on at its time limit (held back in
/// the network): the next attempt, on a fresh connection, finds the row the late one wrote.
async fn a_save_that_lands_after_it_was_given_up_on_leaves_a_larger_token(db: Db) {
    let resource = "lost-answer:late";
    let id = key_id_of(&db, resource).await;
    let armed = Arc::new(AtomicBool::new(false));
    let hold_back = armed.clone();
    let (proxy, held) = HeldRequest::start(db.port(), Duration::from_millis(1500), move |_, c| {
        hold_back.load(Ordering::Acquire) && c.windows(id.len()).any(|w| w == id.as_bytes())
    });
    let store = SqlStore::from_dsn(&format!("{}?statement_timeout=1", via(&db, proxy))).unwrap();
    let key = Key::new(resource);
    let (first, between) = hold_then_expire_unseen(&db, &store, &key).await;

    armed.store(true, Ordering::Release);
    let given_up = store.save(&key, TTL).await;
    assert!(given_up.is_err(), "not given up on: {given_up:?}");
    tokio::task::spawn_blocking(move || held.wait_landed(Duration::from_secs(5)))
        .await
        .unwrap();
    key.reset_lifetime();
    let again = token(store.save(&key, TTL).await.unwrap());
    assert!(
        again.is_some_and(|t| t > between),
        "acquired again after {between} (its own first hold {first}), got {again:?}"
    );
    assert!(store.delete(&key).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_save_that_lands_after_it_was_given_up_on_leaves_a_larger_token() {
    a_save_that_lands_after_it_was_given_up_on_leaves_a_larger_token(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_save_that_lands_after_it_was_given_up_on_leaves_a_larger_token() {
    a_save_that_lands_after_it_was_given_up_on_leaves_a_larger_token(Db::mariadb()).await;
}
