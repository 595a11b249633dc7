//! `xtr-lock` on the SQL table store: `migrate` makes the tables, `run` holds a row, `status`
//! shows it, and a row deleted behind the holder's back stops the command (exit 3).

mod common;

use std::path::Path;
use std::process::Child;

use common::{wait_exit, wait_gone, xtr};
use xtr_lock_testkit::postgres::PostgresServer;

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
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("made lock_keys and lock_keys_fence"));
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
