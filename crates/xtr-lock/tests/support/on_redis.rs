//! Locks on a throwaway Redis server the test started.

use std::sync::Arc;
use std::time::Duration;

use xtr_lock::store::{CombinedStore, ConsensusStrategy};
use xtr_lock::{Lock, LockFactory, RedisStore};
use xtr_lock_testkit::redis::RedisServer;

/// A lifetime no test outlasts.
pub(crate) const TTL: Duration = Duration::from_secs(30);

/// A store on database 0 of `server`.
pub(crate) fn store(server: &RedisServer) -> RedisStore {
    RedisStore::from_dsn(&server.url(0)).unwrap()
}

/// A lock on `resource` in `store`, for `ttl`.
pub(crate) fn lock(store: &RedisStore, resource: &str, ttl: Duration) -> Lock {
    LockFactory::new(store.clone())
        .create_lock(resource)
        .with_ttl(Some(ttl))
}

/// Three throwaway servers and a consensus quorum over them.
pub(crate) struct Quorum {
    pub(crate) servers: Vec<RedisServer>,
    pub(crate) store: Arc<CombinedStore>,
}

/// A quorum over three new servers, each DSN ending in `extra` (`?socket_timeout=0.5`).
pub(crate) fn quorum(extra: &str) -> Quorum {
    let servers: Vec<_> = (0..3).map(|_| RedisServer::start()).collect();
    let dsns: Vec<String> = servers
        .iter()
        .map(|s| format!("{}{extra}", s.url(0)))
        .collect();
    let dsns: Vec<&str> = dsns.iter().map(String::as_str).collect();
    let store = Arc::new(CombinedStore::from_dsns(&dsns, ConsensusStrategy).unwrap());
    Quorum { servers, store }
}

impl Quorum {
    /// A factory on the quorum with the default test ttl.
    pub(crate) fn factory(&self) -> LockFactory {
        LockFactory::from_arc(self.store.clone()).with_ttl(Some(TTL))
    }
}

/// A master and a replica of it, once the replica is in sync (online).
pub(crate) fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start();
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !master
        .cli(&["INFO", "replication"])
        .contains("state=online")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never came online"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (master, replica)
}

/// A plain connection to database 0 of `server`, to look at what the store wrote.
pub(crate) fn sync_conn(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url(0))
        .unwrap()
        .get_connection()
        .unwrap()
}

/// The tickets in `resource`'s wait queue, first first.
pub(crate) fn queue(server: &RedisServer, store: &RedisStore, resource: &str) -> Vec<String> {
    queue_in(server, 0, store, resource)
}

/// The tickets in `resource`'s wait queue in database `db`, first first.
pub(crate) fn queue_in(
    server: &RedisServer,
    db: u32,
    store: &RedisStore,
    resource: &str,
) -> Vec<String> {
    let mut conn = redis::Client::open(server.url(db))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("ZRANGE")
        .arg(store.internal_key(&format!("queue:{resource}")))
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap()
}

/// Waits (real time, bounded) until `cond` holds.
pub(crate) async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Locks on `store` whose clock never moves: no poll and no lease-hint sleep can ever end, so
/// only a wake gets a waiter in.
pub(crate) fn frozen(store: &RedisStore) -> LockFactory {
    LockFactory::new(store.clone())
        .with_clock(Arc::new(xtr_lock::ManualClock::frozen()))
        .with_ttl(Some(TTL))
}
