//! The `xtr-lock` command on each server store: session locks (advisory, `GET_LOCK`), etcd
//! (with the `etcd` feature), the pub/sub store, the SQL table store, and Symfony's semaphore
//! and Memcached stores; Redis Cluster and Sentinel; counting semaphores (`run --limit`).

#[path = "../common/mod.rs"]
mod common;

mod advisory;
#[cfg(feature = "etcd")]
mod etcd;
mod handover;
mod jobs;
mod pubsub;
mod redis_topologies;
mod semaphores;
mod sql;
mod standby;
mod store_checks;
mod symfony_stores;
