//! `Store::release_after` on every expiring store, on real throwaway servers: a holder with a
//! 30 s ttl lets its lock run out 2 s after the call; others are refused until then (on the
//! server's clock) and get it soon after, a waiter included; the holder keeps nothing; a key
//! that lost its lock is told so. Stores that cannot answer `None`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::store::{CombinedStore, ConsensusStrategy, Holding};
use xtr_lock::{
    EtcdStore, FlockStore, InMemoryStore, Key, LockFactory, Lockable as _, MemcachedStore, Mode,
    MonotonicClock, Permits, PgAdvisoryStore, RedisPubSubStore, RedisStore, SqlStore, Store,
};
use xtr_lock_testkit::etcd::EtcdCluster;
use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::postgres::PostgresServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::quorum;
use crate::support::symfony_sql::Db;

const TTL: Option<Duration> = Some(Duration::from_secs(30));
const AFTER: Duration = Duration::from_secs(2);

fn resource(name: &str) -> String {
    format!("release-after:{name}:{:08x}", rand::random::<u32>())
}

/// Whether `key` takes the write lock now.
async fn takes(store: &dyn Store, key: &Key) -> bool {
    store.save(key, TTL).await.unwrap().is_acquired()
}

/// A holder in `mode` lets its lock run out `AFTER` from the call: a writer is refused right
/// after and at 1.5 s, and takes it by `AFTER + slack` (polling every 100 ms); the first
/// holder then holds nothing.
async fn runs_out(store: &dyn Store, mode: Mode, slack: Duration) {
    runs_out_with(store, mode, slack, |r| Key::new(r)).await;
}

/// As [`runs_out`], for the keys `new_key` makes (a semaphore holder's: one permit of one).
async fn runs_out_with(store: &dyn Store, mode: Mode, slack: Duration, new_key: fn(&str) -> Key) {
    let r = resource("runs-out");
    let first = new_key(&r);
    let saved = match mode {
        Mode::Write => store.save(&first, TTL).await,
        Mode::Read => store.save_read(&first, TTL).await,
    };
    assert!(saved.unwrap().is_acquired());
    let called = Instant::now();
    let held = store.release_after(&first, AFTER).await.unwrap();
    assert_eq!(held, Some(Holding::Held(mode)), "{store}");
    let second = new_key(&r);
    assert!(!takes(store, &second).await, "{store}: taken right after");
    tokio::time::sleep_until((called + Duration::from_millis(1500)).into()).await;
    assert!(!takes(store, &second).await, "{store}: taken at 1.5 s");
    loop {
        if takes(store, &second).await {
            break;
        }
        assert!(
            called.elapsed() < AFTER + slack,
            "{store}: not free {:?} after",
            AFTER + slack
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(called.elapsed() >= AFTER, "{store}: free before {AFTER:?}");
    assert!(!store.exists(&first).await.unwrap().is_held(), "{store}");
    assert!(store.delete(&second).await.unwrap());
}

/// A waiter on `elsewhere` (another store on the same server, as in another process) queued
/// before the release gets the lock once it runs out, not when the lifetime its last refusal
/// named (30 s) would have ended.
async fn a_waiter_gets_it(store: Arc<dyn Store>, elsewhere: Arc<dyn Store>, slack: Duration) {
    let r = resource("waiter");
    let first = Key::new(&r);
    assert!(takes(store.as_ref(), &first).await);
    let waiter = LockFactory::from_arc(elsewhere)
        .with_ttl(TTL)
        .create_lock(&r);
    let waiting = tokio::spawn(async move {
        waiter.acquire().await.unwrap();
        let at = Instant::now();
        let _ = waiter.release().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let called = Instant::now();
    let held = store.release_after(&first, AFTER).await.unwrap();
    assert_eq!(held, Some(Holding::Held(Mode::Write)), "{store}");
    let got = tokio::time::timeout(AFTER + slack, waiting)
        .await
        .unwrap_or_else(|_| panic!("{store}: the waiter waits on past {:?}", AFTER + slack))
        .unwrap();
    assert!(got >= called + AFTER, "{store}: the waiter got it early");
}

/// A key whose lock is gone (deleted by a copy of it, as another process would) is told so,
/// and the lock is free.
async fn a_lost_lock_is_not_held(store: &dyn Store) {
    let r = resource("lost");
    let first = Key::new(&r);
    assert!(takes(store, &first).await);
    let copy = Key::from_json(&first.to_json().unwrap()).unwrap();
    assert!(store.delete(&copy).await.unwrap());
    let held = store.release_after(&first, AFTER).await.unwrap();
    assert!(
        matches!(held, Some(Holding::NotHeld(_))),
        "{store}: {held:?}"
    );
    assert!(takes(store, &Key::new(&r)).await, "{store}");
}

// ---- Redis -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_writers_and_readers_run_out_on_the_server() {
    let server = RedisServer::start();
    let store = RedisStore::from_dsn(&server.url(0)).unwrap();
    let slack = Duration::from_millis(500);
    runs_out(&store, Mode::Write, slack).await;
    runs_out(&store, Mode::Read, slack).await;
    a_lost_lock_is_not_held(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_wakes_its_waiters_to_learn_the_new_end() {
    let server = RedisServer::start();
    let store = || Arc::new(RedisStore::from_dsn(&server.url(0)).unwrap());
    let slack = Duration::from_millis(800);
    a_waiter_gets_it(store(), store(), slack).await;
    let one = store();
    a_waiter_gets_it(one.clone(), one, slack).await;
}

// ---- SQL: whole seconds, a row taken up to 1 s early -------------------------------------------

/// At most 1 s past `AFTER` (rounded up, plus the early second), and the polling.
const SQL_SLACK: Duration = Duration::from_millis(1900);

/// Waiters in this process and in another (a second store: PostgreSQL tells it through its
/// listener; the others poll).
async fn on_sql(store: impl Fn() -> SqlStore) {
    let one = Arc::new(store());
    one.create_table().await.unwrap();
    runs_out(one.as_ref(), Mode::Write, SQL_SLACK).await;
    a_lost_lock_is_not_held(one.as_ref()).await;
    a_waiter_gets_it(one.clone(), one, SQL_SLACK).await;
    a_waiter_gets_it(Arc::new(store()), Arc::new(store()), SQL_SLACK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rows_run_out_no_sooner_than_asked() {
    let db = Db::postgres();
    on_sql(|| db.store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_rows_run_out_no_sooner_than_asked() {
    let db = Db::mariadb();
    on_sql(|| db.store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_rows_run_out_no_sooner_than_asked() {
    let dir = tempfile::tempdir().unwrap();
    let dsn = format!("sqlite://{}/locks.db", dir.path().display());
    on_sql(|| SqlStore::from_dsn(&dsn).unwrap()).await;
}

// ---- Memcached: whole seconds --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_entries_run_out_no_sooner_than_asked() {
    let server = MemcachedServer::start();
    let store = MemcachedStore::from_dsn(&server.url()).unwrap();
    runs_out(&store, Mode::Write, SQL_SLACK).await;
    a_lost_lock_is_not_held(&store).await;
    let store = Arc::new(store);
    a_waiter_gets_it(store.clone(), store, SQL_SLACK).await;
}

// ---- etcd: the key moves to a lease nobody keeps alive -------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keys_run_out_on_a_lease_nobody_keeps_alive() {
    let cluster = EtcdCluster::single();
    let store = EtcdStore::from_dsn(&cluster.dsn("")).unwrap();
    runs_out(&store, Mode::Write, Duration::from_millis(1500)).await;
    runs_out(&store, Mode::Read, Duration::from_millis(1500)).await;

    // The key stays, on another lease, until that lease ends on the cluster; the holder's own
    // lease is revoked and nothing of the holder is kept.
    let r = resource("etcd");
    let first = Key::new(&r);
    assert!(takes(&store, &first).await);
    let lease = store.lease_id(&first).unwrap();
    let called = Instant::now();
    let held = store.release_after(&first, AFTER).await.unwrap();
    assert_eq!(held, Some(Holding::Held(Mode::Write)));
    assert_eq!(store.lease_id(&first), None, "the holder let its lease go");
    // It is a new holder: its save queues behind the key it left, its release deletes nothing.
    assert!(!takes(&store, &first).await);
    assert!(!store.delete(&first).await.unwrap());
    let dir = store.directory(&r);
    let keys = super::etcd::keys(&cluster, &dir);
    assert_eq!(keys, vec![format!("{dir}{lease:x}")], "the key stands");
    let leases = cluster.etcdctl_output(&["lease", "list"]);
    super::etcd::until("the holder's lease is revoked", || {
        !cluster
            .etcdctl_output(&["lease", "list"])
            .contains(&format!("{lease:x}"))
    })
    .await;
    super::etcd::until("the key is gone with its lease", || {
        super::etcd::keys(&cluster, &dir).is_empty()
    })
    .await;
    assert!(called.elapsed() >= AFTER, "gone early; leases: {leases}");
    assert!(
        super::etcd::keys(&cluster, "xtr-meta/").is_empty(),
        "no record is left behind"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_deleted_key_is_not_held_and_its_waiter_gets_it() {
    let cluster = EtcdCluster::single();
    let store = Arc::new(EtcdStore::from_dsn(&cluster.dsn("")).unwrap());
    let r = resource("etcd-lost");
    let first = Key::new(&r);
    assert!(takes(store.as_ref(), &first).await);
    cluster.etcdctl_output(&["del", "--prefix", &store.directory(&r)]);
    let held = store.release_after(&first, AFTER).await.unwrap();
    assert!(matches!(held, Some(Holding::NotHeld(_))), "{held:?}");
    assert!(takes(store.as_ref(), &Key::new(&r)).await);
    a_waiter_gets_it(store.clone(), store, Duration::from_millis(1500)).await;
}

// ---- the quorum, and the stores that cannot -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_quorum_runs_out_on_its_members() {
    let q = quorum("");
    runs_out(q.store.as_ref(), Mode::Write, Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_releases_the_members_that_cannot_and_keeps_holding_without_enough() {
    let servers: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let memory = Arc::new(InMemoryStore::new());
    let mut members: Vec<Arc<dyn Store>> = servers
        .iter()
        .map(|s| Arc::new(RedisStore::from_dsn(&s.url(0)).unwrap()) as Arc<dyn Store>)
        .collect();
    members.push(memory.clone());
    let store = CombinedStore::new(members, ConsensusStrategy).unwrap();
    let r = resource("mixed");
    let key = Key::new(&r);
    assert!(takes(&store, &key).await);
    let held = store.release_after(&key, AFTER).await.unwrap();
    assert_eq!(held, Some(Holding::Held(Mode::Write)));
    assert!(
        memory.holders(&r).await.unwrap().is_empty(),
        "the member that cannot let it run out is released"
    );
    assert!(
        !takes(&store, &Key::new(&r)).await,
        "the Redis members hold"
    );

    // Members that cannot, a majority: nothing is done, the holder keeps holding.
    let nones: Vec<Arc<dyn Store>> = (0..3)
        .map(|_| Arc::new(InMemoryStore::new()) as Arc<dyn Store>)
        .collect();
    let store = CombinedStore::new(nones, ConsensusStrategy).unwrap();
    let key = Key::new(&r);
    assert!(takes(&store, &key).await);
    assert_eq!(store.release_after(&key, AFTER).await.unwrap(), None);
    assert!(store.exists(&key).await.unwrap().is_held());
}

#[tokio::test]
async fn an_in_memory_store_with_a_clock_runs_out_and_one_without_cannot() {
    let store = InMemoryStore::expiring(Arc::new(MonotonicClock));
    runs_out(&store, Mode::Write, Duration::from_millis(400)).await;
    runs_out(&store, Mode::Read, Duration::from_millis(400)).await;
    a_lost_lock_is_not_held(&store).await;
    let store = Arc::new(store);
    a_waiter_gets_it(store.clone(), store, Duration::from_millis(400)).await;

    let store = InMemoryStore::new();
    let key = Key::new("never-expires");
    assert!(takes(&store, &key).await);
    assert_eq!(store.release_after(&key, AFTER).await.unwrap(), None);
    assert!(store.exists(&key).await.unwrap().is_held(), "still held");
}

// ---- semaphores: a holder's permits run out alike ------------------------------------------------

fn one_permit(r: &str) -> Key {
    Key::for_semaphore(r, Permits::new(1, 1).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_holders_permits_run_out_no_sooner_than_asked() {
    let redis = RedisServer::start();
    let memcached = MemcachedServer::start();
    let cluster = EtcdCluster::single();
    let dir = tempfile::tempdir().unwrap();
    let sqlite =
        SqlStore::from_dsn(&format!("sqlite://{}/locks.db", dir.path().display())).unwrap();
    sqlite.create_table().await.unwrap();
    let whole_seconds = SQL_SLACK;
    let stores: Vec<(Box<dyn Store>, Duration)> = vec![
        (
            Box::new(RedisStore::from_dsn(&redis.url(0)).unwrap()),
            whole_seconds,
        ),
        (
            Box::new(MemcachedStore::from_dsn(&memcached.url()).unwrap()),
            whole_seconds,
        ),
        (Box::new(sqlite), whole_seconds),
        (
            Box::new(EtcdStore::from_dsn(&cluster.dsn("")).unwrap()),
            Duration::from_millis(1500),
        ),
        (
            Box::new(InMemoryStore::expiring(Arc::new(MonotonicClock))),
            Duration::from_millis(400),
        ),
    ];
    for (store, slack) in stores {
        runs_out_with(store.as_ref(), Mode::Write, slack, one_permit).await;
    }
}

// ---- the stores whose locks die with their holder ------------------------------------------------

/// A store that cannot leave its lock to run out says so, and the holder keeps holding.
async fn cannot(store: &dyn Store) {
    let caps = store.capabilities();
    assert!(!caps.expiring || caps.leased, "{store}");
    let key = Key::new(resource("cannot"));
    assert!(takes(store, &key).await, "{store}");
    assert_eq!(
        store.release_after(&key, AFTER).await.unwrap(),
        None,
        "{store}"
    );
    assert!(
        store.exists(&key).await.unwrap().is_held(),
        "{store}: still held"
    );
    assert!(store.delete(&key).await.unwrap(), "{store}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flock_pubsub_and_advisory_locks_cannot_and_keep_holding() {
    let dir = tempfile::tempdir().unwrap();
    cannot(&FlockStore::in_dir(dir.path()).unwrap()).await;
    let redis = RedisServer::start();
    let dsn = format!("redis+pubsub://127.0.0.1:{}", redis.port());
    cannot(&RedisPubSubStore::from_dsn(&dsn).unwrap()).await;
    let pg = PostgresServer::start();
    let url = pg.url();
    let dsn = format!(
        "postgresql+advisory{}",
        url.strip_prefix("postgres").unwrap()
    );
    cannot(&PgAdvisoryStore::from_dsn(&dsn).unwrap()).await;
}
