//! Locks on a throwaway Redis server the test started.

use std::time::Duration;

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
