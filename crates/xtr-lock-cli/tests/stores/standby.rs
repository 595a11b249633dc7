//! `run --standby` on the server stores: how long a standby takes to lead after the leader's
//! xtr-lock is SIGKILLed (printed: at once where the lock dies with its holder, about the ttl
//! where it expires), and turns that never overlap, with increasing terms where the store
//! fences.

use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::postgres::PostgresServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::standby::{
    AT_ONCE, after_ttl, failover, leader_sees_each_change_in_order, turns_never_overlap,
};
use crate::common::xtr;

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
    failover(&dsn, &["--ttl", "2s"], after_ttl(2));
}

#[test]
fn sql_table_on_mysql_fails_over_within_the_ttl_and_fences_each_turn() {
    let server = MariaDbServer::start();
    let dsn = format!("{}?create_table=true", server.url());
    turns_never_overlap(&dsn, &["--ttl", "5s"], 30, true);
    failover(&dsn, &["--ttl", "2s"], after_ttl(2));
}

#[test]
fn sql_table_on_sqlite_fails_over_within_the_ttl_and_fences_each_turn() {
    let dir = tempfile::tempdir().unwrap();
    let dsn = format!(
        "sqlite://{}?create_table=true",
        dir.path().join("locks.db").display()
    );
    turns_never_overlap(&dsn, &["--ttl", "5s"], 30, true);
    failover(&dsn, &["--ttl", "2s"], after_ttl(2));
}

#[test]
fn pg_advisory_fails_over_when_the_session_ends() {
    let server = PostgresServer::start();
    let dsn = format!(
        "postgresql+advisory{}?keepalive=0.2",
        server.url().strip_prefix("postgres").unwrap()
    );
    turns_never_overlap(&dsn, &[], 30, false);
    failover(&dsn, &[], AT_ONCE);
}

#[test]
fn mysql_getlock_fails_over_when_the_connection_ends() {
    let server = MariaDbServer::start();
    let dsn = format!(
        "mysql+getlock{}?keepalive=0.2",
        server.url().strip_prefix("mysql").unwrap()
    );
    turns_never_overlap(&dsn, &[], 30, false);
    failover(&dsn, &[], AT_ONCE);
}

#[test]
fn memcached_fails_over_within_the_ttl() {
    let server = MemcachedServer::start();
    turns_never_overlap(&server.url(), &["--ttl", "5s"], 30, false);
    failover(&server.url(), &["--ttl", "2s"], after_ttl(2));
}

#[test]
fn sysv_semaphore_fails_over_at_once() {
    turns_never_overlap("semaphore", &[], 30, false);
    failover("semaphore", &[], AT_ONCE);
}

#[test]
fn pubsub_fails_over_when_the_holder_stops_answering() {
    let server = RedisServer::start();
    let dsn = format!("redis+pubsub://127.0.0.1:{}/0", server.port());
    turns_never_overlap(&dsn, &[], 30, true);
    failover(&dsn, &[], AT_ONCE);
}

/// A quorum of three Redis servers: a leader is whoever holds on two of them.
#[test]
fn redis_quorum_fails_over_within_the_ttl() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let dsn = servers
        .iter()
        .map(|s| s.url(0))
        .collect::<Vec<_>>()
        .join(",");
    turns_never_overlap(&dsn, &["--ttl", "5s"], 30, false);
    failover(&dsn, &["--ttl", "2s"], after_ttl(2));
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_leader_watch_prints_each_change_in_order() {
    let cluster = xtr_lock_testkit::etcd::EtcdCluster::single();
    leader_sees_each_change_in_order(&cluster.dsn(""));
}

#[test]
fn memcached_leader_watch_prints_each_change_in_order() {
    let server = MemcachedServer::start();
    leader_sees_each_change_in_order(&server.url());
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_fails_over_when_the_lease_ends_and_fences_each_turn() {
    let cluster = xtr_lock_testkit::etcd::EtcdCluster::single();
    let dsn = cluster.dsn("");
    turns_never_overlap(&dsn, &["--ttl", "5s"], 30, true);
    failover(&dsn, &["--ttl", "2s"], after_ttl(2));
}
