//! The fault suite's short form: every scenario of `xtr-lock-faults` for two seconds, on this
//! build's `xtr-lock` (the long form: `xtr-lock-faults --duration 10m`).

use std::time::Duration;

use xtr_lock_faults::{Scenario, run};

fn scenario(name: &str) {
    let mut scenario = Scenario::all(Duration::from_secs(2))
        .into_iter()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("no scenario {name}"));
    scenario.workers = 3;
    let report = run(&assert_cmd::cargo::cargo_bin("xtr-lock"), &scenario).unwrap();
    assert!(report.sections > 0, "{name}: no section ran: {report:?}");
    assert!(
        report.faults > 0,
        "{name}: no fault was injected: {report:?}"
    );
    assert!(
        report.violations.is_empty(),
        "{name}: {} violations:\n{}",
        report.violations.len(),
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
    redis_kill_holder => "redis/kill-holder",
    redis_kill_xtr_lock => "redis/kill-xtr-lock",
    redis_stop_xtr_lock => "redis/stop-xtr-lock",
    redis_stop_holder => "redis/stop-holder",
    redis_stop_server => "redis/stop-server",
    redis_restart_server_empty => "redis/restart-server-empty",
    redis_delay_proxy => "redis/delay-proxy",
    quorum_kill_holder => "quorum/kill-holder",
    quorum_kill_xtr_lock => "quorum/kill-xtr-lock",
    quorum_stop_xtr_lock => "quorum/stop-xtr-lock",
    quorum_stop_1_members => "quorum/stop-1-members",
    quorum_stop_2_members => "quorum/stop-2-members",
    quorum_kill_1_members => "quorum/kill-1-members",
    etcd_kill_holder => "etcd/kill-holder",
    etcd_kill_xtr_lock => "etcd/kill-xtr-lock",
    etcd_stop_xtr_lock => "etcd/stop-xtr-lock",
    etcd_stop_holder => "etcd/stop-holder",
    etcd_stop_1_members => "etcd/stop-1-members",
    etcd_kill_leader => "etcd/kill-leader",
    quorum_kill_2_members => "quorum/kill-2-members",
    quorum_delay_proxy => "quorum/delay-proxy",
}
