//! The fault suite's short form: every scenario of `xtr-lock-faults` for two seconds with three
//! workers (plus the read mixes' eight readers), on this build's `xtr-lock`; one test per store,
//! whose scenarios run one after another on the same servers (the long form:
//! `xtr-lock-faults --duration 10m`).

use std::time::Duration;

use xtr_lock_faults::{Fault, Scenario, Target, run_with};

/// Runs every scenario on `target` and fails with every violation of each.
fn target(target: Target) {
    let mut servers = None;
    let mut failures = Vec::new();
    for mut scenario in Scenario::all(Duration::from_secs(2))
        .into_iter()
        .filter(|s| s.target == target)
    {
        scenario.workers = 3;
        let name = scenario.name();
        let report = run_with(
            &assert_cmd::cargo::cargo_bin("xtr-lock"),
            &scenario,
            &mut servers,
        )
        .unwrap();
        if report.sections == 0 {
            failures.push(format!("{name}: no section ran: {report:?}"));
        }
        if report.faults == 0 && scenario.fault != Fault::ReadMix {
            failures.push(format!("{name}: no fault was injected: {report:?}"));
        }
        if !report.violations.is_empty() {
            failures.push(format!(
                "{name}: {} violations (the log: {:?}):\n{}",
                report.violations.len(),
                report.log,
                report.violations.join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

macro_rules! targets {
    ($($test:ident => $target:expr,)*) => {
        $(#[test] fn $test() { target($target) })*

        /// Every target of the suite has its test here.
        #[test]
        fn every_target_is_run() {
            let here = [$($target),*];
            for s in Scenario::all(Duration::ZERO) {
                assert!(here.contains(&s.target), "no test for {}", s.name());
            }
        }
    };
}

targets! {
    flock => Target::Flock,
    semaphore => Target::Semaphore,
    sqlite => Target::Sqlite,
    redis => Target::Redis,
    quorum => Target::Quorum,
    etcd => Target::Etcd,
    pubsub => Target::PubSub,
    sql_postgres => Target::SqlPostgres,
    sql_mariadb => Target::SqlMariaDb,
    advisory => Target::Advisory,
    getlock => Target::GetLock,
    memcached => Target::Memcached,
}
