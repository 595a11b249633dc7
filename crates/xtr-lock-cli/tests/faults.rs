//! The fault suite's short form: every scenario of `xtr-lock-faults` for two seconds with three
//! workers (plus the read mixes' eight readers), on this build's `xtr-lock` (the long form:
//! `xtr-lock-faults --duration 10m`).

use std::time::Duration;

use xtr_lock_faults::{Fault, Scenario, run};

fn scenario(name: &str) {
    let mut scenario = Scenario::all(Duration::from_secs(2))
        .into_iter()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("no scenario {name}"));
    scenario.workers = 3;
    let report = run(&assert_cmd::cargo::cargo_bin("xtr-lock"), &scenario).unwrap();
    assert!(report.sections > 0, "{name}: no section ran: {report:?}");
    assert!(
        report.faults > 0 || scenario.fault == Fault::ReadMix,
        "{name}: no fault was injected: {report:?}"
    );
    assert!(
        report.violations.is_empty(),
        "{name}: {} violations (the log: {:?}):\n{}",
        report.violations.len(),
        report.log,
        report.violations.join("\n")
    );
}

macro_rules! scenarios {
    ($($test:ident => $name:literal,)*) => {
        $(#[test] fn $test() { scenario($name) })*

        /// Every scenario of the suite has its test here.
        #[test]
        fn every_scenario_is_run() {
            let here = [$($name),*];
            for s in Scenario::all(Duration::ZERO) {
                assert!(here.contains(&s.name().as_str()), "no test for {}", s.name());
            }
        }
    };
}

scenarios! {
    flock_kill_holder => "flock/kill-holder",
    flock_kill_xtr_lock => "flock/kill-xtr-lock",
    flock_stop_xtr_lock => "flock/stop-xtr-lock",
    flock_stop_holder => "flock/stop-holder",
    flock_read_mix => "flock/read-mix",
    semaphore_kill_holder => "semaphore/kill-holder",
    semaphore_kill_xtr_lock => "semaphore/kill-xtr-lock",
    semaphore_stop_xtr_lock => "semaphore/stop-xtr-lock",
    semaphore_stop_holder => "semaphore/stop-holder",
    sqlite_kill_holder => "sqlite/kill-holder",
    sqlite_kill_xtr_lock => "sqlite/kill-xtr-lock",
    sqlite_stop_xtr_lock => "sqlite/stop-xtr-lock",
    sqlite_stop_holder => "sqlite/stop-holder",
    redis_kill_holder => "redis/kill-holder",
    redis_kill_xtr_lock => "redis/kill-xtr-lock",
    redis_stop_xtr_lock => "redis/stop-xtr-lock",
    redis_stop_holder => "redis/stop-holder",
    redis_stop_server => "redis/stop-server",
    redis_restart_server_empty => "redis/restart-server-empty",
    redis_delay_proxy => "redis/delay-proxy",
    redis_partition => "redis/partition",
    redis_read_mix => "redis/read-mix",
    quorum_kill_holder => "quorum/kill-holder",
    quorum_kill_xtr_lock => "quorum/kill-xtr-lock",
    quorum_stop_xtr_lock => "quorum/stop-xtr-lock",
    quorum_stop_1_members => "quorum/stop-1-members",
    quorum_stop_2_members => "quorum/stop-2-members",
    quorum_kill_1_members => "quorum/kill-1-members",
    quorum_kill_2_members => "quorum/kill-2-members",
    quorum_delay_proxy => "quorum/delay-proxy",
    quorum_partition => "quorum/partition",
    quorum_read_mix => "quorum/read-mix",
    etcd_kill_holder => "etcd/kill-holder",
    etcd_kill_xtr_lock => "etcd/kill-xtr-lock",
    etcd_stop_xtr_lock => "etcd/stop-xtr-lock",
    etcd_stop_holder => "etcd/stop-holder",
    etcd_stop_1_members => "etcd/stop-1-members",
    etcd_kill_leader => "etcd/kill-leader",
    etcd_partition => "etcd/partition",
    etcd_read_mix => "etcd/read-mix",
    pubsub_kill_holder => "pubsub/kill-holder",
    pubsub_kill_xtr_lock => "pubsub/kill-xtr-lock",
    pubsub_stop_xtr_lock => "pubsub/stop-xtr-lock",
    pubsub_stop_holder => "pubsub/stop-holder",
    pubsub_stop_server => "pubsub/stop-server",
    pubsub_restart_server => "pubsub/restart-server",
    pubsub_terminate_backend => "pubsub/terminate-backend",
    pubsub_partition => "pubsub/partition",
    pubsub_read_mix => "pubsub/read-mix",
    sql_postgres_kill_holder => "sql-postgres/kill-holder",
    sql_postgres_kill_xtr_lock => "sql-postgres/kill-xtr-lock",
    sql_postgres_stop_xtr_lock => "sql-postgres/stop-xtr-lock",
    sql_postgres_stop_holder => "sql-postgres/stop-holder",
    sql_postgres_stop_server => "sql-postgres/stop-server",
    sql_postgres_restart_server => "sql-postgres/restart-server",
    sql_postgres_terminate_backend => "sql-postgres/terminate-backend",
    sql_postgres_partition => "sql-postgres/partition",
    sql_mariadb_kill_holder => "sql-mariadb/kill-holder",
    sql_mariadb_kill_xtr_lock => "sql-mariadb/kill-xtr-lock",
    sql_mariadb_stop_xtr_lock => "sql-mariadb/stop-xtr-lock",
    sql_mariadb_stop_holder => "sql-mariadb/stop-holder",
    sql_mariadb_stop_server => "sql-mariadb/stop-server",
    sql_mariadb_restart_server => "sql-mariadb/restart-server",
    sql_mariadb_terminate_backend => "sql-mariadb/terminate-backend",
    sql_mariadb_partition => "sql-mariadb/partition",
    advisory_kill_holder => "advisory/kill-holder",
    advisory_kill_xtr_lock => "advisory/kill-xtr-lock",
    advisory_stop_xtr_lock => "advisory/stop-xtr-lock",
    advisory_stop_holder => "advisory/stop-holder",
    advisory_stop_server => "advisory/stop-server",
    advisory_restart_server => "advisory/restart-server",
    advisory_terminate_backend => "advisory/terminate-backend",
    advisory_partition => "advisory/partition",
    advisory_read_mix => "advisory/read-mix",
    getlock_kill_holder => "getlock/kill-holder",
    getlock_kill_xtr_lock => "getlock/kill-xtr-lock",
    getlock_stop_xtr_lock => "getlock/stop-xtr-lock",
    getlock_stop_holder => "getlock/stop-holder",
    getlock_stop_server => "getlock/stop-server",
    getlock_restart_server => "getlock/restart-server",
    getlock_terminate_backend => "getlock/terminate-backend",
    getlock_partition => "getlock/partition",
    memcached_kill_holder => "memcached/kill-holder",
    memcached_kill_xtr_lock => "memcached/kill-xtr-lock",
    memcached_stop_xtr_lock => "memcached/stop-xtr-lock",
    memcached_stop_server => "memcached/stop-server",
    memcached_restart_server => "memcached/restart-server",
    memcached_partition => "memcached/partition",
}
