//! `xtr-lock` on the SQL table store: `migrate` makes the tables, `run` holds a row, `status`
//! shows it, and a row deleted behind the holder's back stops the command (exit 3); a holder
//! cut off from its database, or whose database is paused, still exits.

use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use xtr_lock_testkit::hook_proxy::Freezer;
use xtr_lock_testkit::postgres::PostgresServer;

use crate::common;
use crate::common::{wait_exit, wait_gone, xtr};

fn run_holding(dsn: &str, resource: &str, tmp: &Path) -> (Child, i32) {
    common::run_holding(
        &["run", "--store", dsn, "--ttl", "6", resource],
        &tmp.join("pid"),
    )
}

#[test]
fn migrate_then_run_status_and_a_deleted_row_stops_the_command() {
    let server = PostgresServer::start();
    let dsn = server.url();
    // Without the tables, a clear error that says what to do.
    let out = xtr()
        .args(["run", "--store", &dsn, "job", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xtr-lock migrate"), "{err}");
    let out = xtr().args(["migrate", "--store", &dsn]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(
        "made lock_keys, lock_keys_fence, lock_keys_holder, lock_keys_queue, lock_keys_sem and \
         lock_keys_perm"
    ));
    let out = xtr().args(["migrate", "--store", &dsn]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("already there"));
    let out = xtr()
        .args(["migrate", "--store", &dsn, "--print"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("key_expiration INTEGER"));

    let tmp = tempfile::tempdir().unwrap();
    let (mut run, pid) = run_holding(&dsn, "job", tmp.path());
    let out = xtr()
        .args(["status", "--store", &dsn, "job"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("held by holder") && text.contains("table lock_keys"),
        "{text}"
    );
    let busy = xtr()
        .args(["run", "-n", "--store", &dsn, "job", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(1));

    // Someone deletes the row: the next renewal finds the lock lost.
    server.psql("DELETE FROM lock_keys");
    let status = wait_exit(&mut run, "run did not notice the lost lock");
    assert_eq!(status.code(), Some(3));
    wait_gone(pid, "the command of a lost lock");
}

/// Waits up to `limit` for `run` to exit; its status and when, or `None`.
fn exit_within(run: &mut Child, limit: Duration) -> Option<(ExitStatus, Duration)> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(status) = run.try_wait().unwrap() {
            return Some((status, started.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A holder whose database stops answering (cut off by a partition, or paused) has its
/// command stopped once its lock may have run out, and exits then: its release and its
/// closing are bounded, instead of waiting for the database to answer again.
fn exits_after_its_database_goes_silent(partition: bool) {
    let server = PostgresServer::start();
    let out = xtr()
        .args(["migrate", "--store", &server.url()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let (proxy, freezer) = Freezer::start(server.port());
    let dsn = server
        .url()
        .replace(&format!(":{}/", server.port()), &format!(":{proxy}/"));
    let tmp = tempfile::tempdir().unwrap();
    let (mut run, pid) = common::run_holding(
        &["run", "--store", &dsn, "--ttl", "4", "silent"],
        &tmp.path().join("pid"),
    );
    if partition {
        freezer.freeze();
    } else {
        server.pause();
    }
    let exited = exit_within(&mut run, Duration::from_secs(40));
    freezer.thaw();
    server.resume();
    let Some((status, took)) = exited else {
        common::stop(run);
        panic!("run had not exited 40 s after its database went silent");
    };
    assert_ne!(status.code(), Some(0), "{status:?} after {took:?}");
    wait_gone(pid, "the command of a lock that ran out");
}

#[test]
fn run_exits_after_a_partition_from_its_database() {
    exits_after_its_database_goes_silent(true);
}

#[test]
fn run_exits_with_its_database_paused() {
    exits_after_its_database_goes_silent(false);
}

/// `run -w 3` against a database that is down ends by its wait with one line naming the refused
/// connection: not a pool timeout after the connect timeout, nor "did not answer".
#[test]
fn run_with_its_database_down_says_connection_refused_within_the_wait() {
    let mut server = PostgresServer::start();
    let dsn = format!("{}?connect_timeout=10", server.url());
    server.kill();
    let started = Instant::now();
    let out = xtr()
        .args(["run", "--store", &dsn, "-w", "3", "down", "--", "true"])
        .output()
        .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.to_lowercase().contains("connection refused"), "{err}");
    assert!(took < Duration::from_secs(6), "{took:?}: {err}");
}

/// MariaDB is fair too: a database migrated without the queue (`?fair=false`) is named in one
/// line with what to do, and `migrate` adds the queue beside the tables there.
#[test]
fn mariadb_a_database_without_the_queue_is_named_then_migrated() {
    let server = xtr_lock_testkit::mariadb::MariaDbServer::start();
    let dsn = server.url();
    let old = xtr()
        .args(["migrate", "--store", &format!("{dsn}?fair=false")])
        .output()
        .unwrap();
    assert!(old.status.success());
    assert!(!String::from_utf8_lossy(&old.stdout).contains("lock_keys_queue"));
    let out = xtr()
        .args(["run", "-n", "--store", &dsn, "job", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lock_keys_queue")
            && err.contains("xtr-lock migrate")
            && err.trim_end().lines().count() == 1,
        "{err}"
    );
    let out = xtr().args(["migrate", "--store", &dsn]).output().unwrap();
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("made ") && said.contains("lock_keys_queue"),
        "{said}"
    );
    let ran = xtr()
        .args(["run", "-n", "--store", &dsn, "job", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(ran.status.code(), Some(0));
}
