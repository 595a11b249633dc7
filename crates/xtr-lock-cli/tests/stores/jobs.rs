//! Minimum holds on the server stores: left to the store's clock where locks expire (the SQL
//! table, Memcached, etcd: `run` exits at once and the lock stays held until the hold ends),
//! held by `xtr-lock` itself where the lock is a session's (PostgreSQL advisory locks).

use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::postgres::PostgresServer;

use crate::common::jobs::{min_hold_held_by_xtr_lock, min_hold_left_to_the_store};
use crate::common::xtr;

#[test]
fn sql_leaves_a_minimum_hold_to_the_database() {
    let server = PostgresServer::start();
    let dsn = server.url();
    xtr().args(["migrate", "--store", &dsn]).assert().success();
    min_hold_left_to_the_store(&dsn, "min");
}

#[test]
fn memcached_leaves_a_minimum_hold_to_the_server() {
    let server = MemcachedServer::start();
    min_hold_left_to_the_store(&server.url(), "min");
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_leaves_a_minimum_hold_to_the_cluster() {
    let cluster = xtr_lock_testkit::etcd::EtcdCluster::single();
    min_hold_left_to_the_store(&cluster.dsn(""), "min");
}

#[test]
fn advisory_locks_are_held_by_xtr_lock_until_the_minimum_hold_ends() {
    let server = PostgresServer::start();
    let dsn = format!(
        "postgresql+advisory{}",
        server.url().strip_prefix("postgres").unwrap()
    );
    let tmp = tempfile::tempdir().unwrap();
    min_hold_held_by_xtr_lock(&dsn, "min", tmp.path());
}
