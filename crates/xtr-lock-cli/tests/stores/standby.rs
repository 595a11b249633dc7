//! `run --standby` on the server stores: how long a standby takes to lead after the leader's
//! xtr-lock is SIGKILLed (printed: at once where the lock dies with its holder, about the ttl
//! where it expires), and turns that never overlap, with increasing terms where the store
//! fences.

use std::time::Duration;

use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::postgres::PostgresServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::standby::{failover, turns_never_overlap};
use crate::common::xtr;

/// Generous: at once is milliseconds, a ttl of 2s a few seconds.
const PATIENCE: Duration = Duration::from_secs(30);

fn migrated(server: &PostgresServer) -> String {
    let dsn = server.url();
    xtr().args(["migrate", "--store", &dsn]).assert().success();
    dsn
}

#[test]
fn sql_table_fails_over_within_the_ttl_and_fences_each_turn() {
    let server = PostgresServer::start();
    let dsn = migrated(&server);
    turns_never_overlap(&dsn, &["--ttl", "5s"], 30, true);
    assert!(failover(&dsn, &["--ttl", "2s"]) < PATIENCE);
}

#[test]
fn pg_advisory_fails_over_when_the_session_ends() {
    let server = PostgresServer::start();
    let dsn = format!(
        "postgresql+advisory{}?keepalive=0.2",
        server.url().strip_prefix("postgres").unwrap()
    );
    assert!(failover(&dsn, &[]) < PATIENCE);
}

#[test]
fn mysql_getlock_fails_over_when_the_connection_ends() {
    let server = MariaDbServer::start();
    let dsn = format!(
        "mysql+getlock{}?keepalive=0.2",
        server.url().strip_prefix("mysql").unwrap()
    );
    assert!(failover(&dsn, &[]) < PATIENCE);
}

#[test]
fn memcached_fails_over_within_the_ttl() {
    let server = MemcachedServer::start();
    assert!(failover(&server.url(), &["--ttl", "2s"]) < PATIENCE);
}

#[test]
fn sysv_semaphore_fails_over_at_once() {
    assert!(failover("semaphore", &[]) < PATIENCE);
}

#[test]
fn pubsub_fails_over_when_the_holder_stops_answering() {
    let server = RedisServer::start();
    let dsn = format!("redis+pubsub://127.0.0.1:{}/0", server.port());
    assert!(failover(&dsn, &[]) < PATIENCE);
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_fails_over_when_the_lease_ends_and_fences_each_turn() {
    let cluster = xtr_lock_testkit::etcd::EtcdCluster::single();
    let dsn = cluster.dsn("");
    turns_never_overlap(&dsn, &["--ttl", "5s"], 30, true);
    assert!(failover(&dsn, &["--ttl", "2s"]) < PATIENCE);
}
