//! Siblings: tasks sharing one `Lock` (clones are one holder). A sibling's timed-out acquire
//! must take back only what its own attempt stored, never the hold a sibling waiting behind it
//! was granted later; and a sibling's pending wait must never block the holder's try, check or
//! release (issue 30). On etcd, PostgreSQL advisory locks and MySQL/MariaDB GET_LOCK.

use std::sync::Arc;
use std::time::Duration;

use xtr_lock::store::Holding;
use xtr_lock::{
    EtcdStore, Lock, LockFactory, Lockable as _, Mode, MySqlLockStore, PgAdvisoryStore, Store,
};
use xtr_lock_testkit::etcd::EtcdCluster;
use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::postgres::PostgresServer;

/// A bound on anything expected to happen "at once" on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long a call of a holder may take while a sibling waits (it must not wait behind it).
const NOT_BLOCKED: Duration = Duration::from_secs(2);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn resource(name: &str) -> String {
    format!("siblings-{name}-{:08x}", rand::random::<u32>())
}

fn etcd(cluster: &EtcdCluster) -> Arc<dyn Store> {
    Arc::new(EtcdStore::from_dsn(&format!("{}?ttl=30", cluster.dsn(""))).unwrap())
}

fn advisory(server: &PostgresServer) -> Arc<dyn Store> {
    let url = server.url();
    let dsn = format!(
        "postgresql+advisory{}",
        url.strip_prefix("postgres").unwrap()
    );
    Arc::new(PgAdvisoryStore::from_dsn(&dsn).unwrap())
}

fn getlock(server: &MariaDbServer) -> Arc<dyn Store> {
    let url = server.url();
    let dsn = format!("mysql+getlock{}", url.strip_prefix("mysql").unwrap());
    Arc::new(MySqlLockStore::from_dsn(&dsn).unwrap())
}

fn factory(store: &Arc<dyn Store>) -> LockFactory {
    LockFactory::from_arc(store.clone()).with_ttl(None)
}

/// `lock.acquire()` in a task of its own (a sibling of `lock`).
fn spawn_acquire(lock: &Lock) -> tokio::task::JoinHandle<xtr_lock::Result<()>> {
    let sibling = lock.clone();
    tokio::spawn(async move { sibling.acquire().await })
}

/// The repro of issue 30: sibling A's `acquire_timeout` gives up while sibling B waits; the
/// other holder releases; B is granted. A's clean-up must not take B's hold away: the store
/// still lists the holder, and a new holder's `try_acquire` is refused.
async fn a_timed_out_sibling_does_not_release_what_a_waiting_sibling_was_granted(
    store: Arc<dyn Store>,
) {
    let f = factory(&store);
    let r = resource("timeout-then-wait");
    let (other, lock) = (f.create_lock(&r), f.create_lock(&r));
    other.acquire().await.unwrap();
    let a = {
        let sibling = lock.clone();
        tokio::spawn(async move { sibling.acquire_timeout(ms(400)).await })
    };
    tokio::time::sleep(ms(100)).await;
    let b = spawn_acquire(&lock);
    let a = tokio::time::timeout(PATIENCE, a)
        .await
        .expect("the timed acquire gives up on time");
    assert!(!a.unwrap().unwrap(), "A timed out: the other holder holds");
    let _ = other.release().await.unwrap();
    tokio::time::timeout(PATIENCE, b)
        .await
        .expect("B is granted after the other holder's release")
        .unwrap()
        .unwrap();
    assert_eq!(
        lock.held_mode(),
        Some(Mode::Write),
        "B's acquire returned Ok"
    );
    // Whatever A left queued has had time to run.
    tokio::time::sleep(ms(1000)).await;
    let third = f.create_lock(&r);
    assert!(
        !third.try_acquire().await.unwrap(),
        "a new holder got the lock while lock.held_mode() == Some(Write): \
         the timed-out sibling's clean-up released the waiting sibling's grant"
    );
    assert_eq!(
        store.exists(lock.key()).await.unwrap(),
        Holding::Held(Mode::Write),
        "the store says the holder writes"
    );
    let held: Vec<_> = store
        .holders(&r)
        .await
        .unwrap()
        .into_iter()
        .filter(|h| !h.waiting)
        .collect();
    assert_eq!(held.len(), 1, "the store lists the one writer: {held:?}");
    assert_eq!(held[0].mode, Mode::Write, "{held:?}");
    assert!(lock.release().await.unwrap().was_held());
}

/// While a sibling waits, the holder's `try_acquire`, `is_acquired` and `release` are
/// answered at once (docs/cancellation.md: a pending wait never blocks a release or refresh of
/// the same holder).
async fn a_waiting_sibling_does_not_block_the_holders_other_calls(store: Arc<dyn Store>) {
    let f = factory(&store);
    let r = resource("wait-blocks");
    let (other, lock) = (f.create_lock(&r), f.create_lock(&r));
    other.acquire().await.unwrap();
    let waiting = spawn_acquire(&lock);
    tokio::time::sleep(ms(300)).await;
    assert!(!waiting.is_finished(), "the sibling waits");
    let tried = tokio::time::timeout(NOT_BLOCKED, lock.try_acquire())
        .await
        .expect("try_acquire returns while a sibling waits (not blocked behind its wait)");
    assert!(!tried.unwrap(), "the other holder holds");
    let checked = tokio::time::timeout(NOT_BLOCKED, lock.is_acquired())
        .await
        .expect("is_acquired returns while a sibling waits (not blocked behind its wait)");
    assert!(!checked.unwrap());
    let released = tokio::time::timeout(NOT_BLOCKED, lock.release())
        .await
        .expect("release returns while a sibling waits (not blocked behind its wait)");
    let _ = released.unwrap();
    waiting.abort();
    let _ = waiting.await;
    let _ = other.release().await.unwrap();
    let fresh = f.create_lock(&r);
    let free = tokio::time::timeout(PATIENCE, fresh.acquire_timeout(PATIENCE))
        .await
        .expect("bounded");
    assert!(free.unwrap(), "the resource is free in the end");
    let _ = fresh.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_timed_out_sibling_does_not_release_what_a_waiting_sibling_was_granted() {
    let cluster = EtcdCluster::single();
    a_timed_out_sibling_does_not_release_what_a_waiting_sibling_was_granted(etcd(&cluster)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_waiting_sibling_does_not_block_the_holders_other_calls() {
    let cluster = EtcdCluster::single();
    a_waiting_sibling_does_not_block_the_holders_other_calls(etcd(&cluster)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_a_timed_out_sibling_does_not_release_what_a_waiting_sibling_was_granted() {
    let server = PostgresServer::start();
    a_timed_out_sibling_does_not_release_what_a_waiting_sibling_was_granted(advisory(&server))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_a_waiting_sibling_does_not_block_the_holders_other_calls() {
    let server = PostgresServer::start();
    a_waiting_sibling_does_not_block_the_holders_other_calls(advisory(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getlock_a_timed_out_sibling_does_not_release_what_a_waiting_sibling_was_granted() {
    let server = MariaDbServer::start();
    a_timed_out_sibling_does_not_release_what_a_waiting_sibling_was_granted(getlock(&server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getlock_a_waiting_sibling_does_not_block_the_holders_other_calls() {
    let server = MariaDbServer::start();
    a_waiting_sibling_does_not_block_the_holders_other_calls(getlock(&server)).await;
}

/// Sibling A's timed-out wait leaves a reconcile (a check) in the session while sibling B's wait
/// is queued behind A's: the check must be answered when A's wait ends, not after B's, or the
/// reconcile holds the holder's turn and every call of the holder waits for B's wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_a_timed_out_siblings_reconcile_does_not_wait_behind_the_next_wait() {
    let server = PostgresServer::start();
    let store = advisory(&server);
    let f = factory(&store);
    let r = resource("advisory-reconcile");
    let (other, lock) = (f.create_lock(&r), f.create_lock(&r));
    other.acquire().await.unwrap();
    let a = {
        let sibling = lock.clone();
        tokio::spawn(async move { sibling.acquire_timeout(ms(400)).await })
    };
    tokio::time::sleep(ms(100)).await;
    let b = spawn_acquire(&lock);
    assert!(!a.await.unwrap().unwrap(), "A timed out");
    tokio::time::sleep(ms(300)).await;
    let checked = tokio::time::timeout(NOT_BLOCKED, lock.is_acquired()).await;
    let _ = other.release().await.unwrap();
    tokio::time::timeout(PATIENCE, b)
        .await
        .expect("B is granted once the other holder released")
        .unwrap()
        .unwrap();
    assert!(
        matches!(checked, Ok(Ok(false))),
        "is_acquired answered while B waited: {checked:?}"
    );
    assert_eq!(lock.held_mode(), Some(Mode::Write));
    let _ = lock.release().await.unwrap();
}
