//! A new acquisition on the SQL table store always carries a fencing token larger than every
//! earlier one, also when its statement landed and the answer was lost with its connection:
//! the store runs the statement again on a fresh connection, which finds the row already this
//! holder's (a re-save, which draws nothing) while the token the first run drew, if it drew
//! one, never came back.

mod support;

use support::symfony_sql::Db;
use xtr_lock::{LockFactory, Lockable as _, SqlStore};
use xtr_lock_testkit::hook_proxy::LostAnswer;

async fn an_acquisition_whose_answer_was_lost_has_a_larger_token(db: Db) {
    let resource = "lost-answer";
    let direct = LockFactory::new(db.store());
    let first = direct.create_lock(resource);
    assert!(first.try_acquire().await.unwrap());
    let before = first.fencing_token().expect("the table store fences");
    // The resource's id is bound to every statement about it: the first to carry it through
    // the proxy (not its preparation, which names no resource) is the acquisition's.
    let id = db.query("SELECT key_id FROM lock_keys");
    assert_eq!(id.len(), 64, "one row: {id:?}");
    first.release().await.unwrap();

    let (proxy, lost) = LostAnswer::start(db.port(), move |_, chunk| {
        chunk.windows(id.len()).any(|w| w == id.as_bytes())
    });
    let url = db
        .url()
        .replace(&format!(":{}/", db.port()), &format!(":{proxy}/"));
    let cut_off =
        LockFactory::new(SqlStore::from_dsn(&format!("{url}?statement_timeout=5")).unwrap());
    let second = cut_off.create_lock(resource);
    assert!(
        second.try_acquire().await.unwrap(),
        "the acquisition landed"
    );
    assert!(lost.cut_at().is_some(), "the acquisition's answer was lost");
    let after = second.fencing_token();
    assert!(
        after.is_some_and(|t| t > before),
        "a new acquisition after {before} got {after:?}"
    );
    second.release().await.unwrap();
    assert!(
        direct.create_lock(resource).try_acquire().await.unwrap(),
        "released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_acquisition_whose_answer_was_lost_has_a_larger_token() {
    an_acquisition_whose_answer_was_lost_has_a_larger_token(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_an_acquisition_whose_answer_was_lost_has_a_larger_token() {
    an_acquisition_whose_answer_was_lost_has_a_larger_token(Db::mariadb()).await;
}
