//! `xtr-lock` on session locks (PostgreSQL advisory locks, MySQL `GET_LOCK`): `run` holds a
//! session, `status` shows the server session holding it, and a session ended by an operator
//! stops the command (exit 3).

use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::postgres::PostgresServer;

use crate::common::{run_holding, wait_exit, wait_gone, xtr};

#[test]
fn run_status_and_a_terminated_backend_stops_the_command() {
    let server = PostgresServer::start();
    let dsn = format!(
        "postgresql+advisory{}?keepalive=0.2",
        server.url().strip_prefix("postgres").unwrap()
    );
    let tmp = tempfile::tempdir().unwrap();
    let (mut run, pid) = run_holding(&["run", "--store", &dsn, "job"], &tmp.path().join("pid"));
    let out = xtr()
        .args(["status", "--store", &dsn, "job"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("held by backend") && text.contains("(xtr-lock, from 127.0.0.1) (write)"),
        "{text}"
    );
    assert!(text.contains("objsubid=1"), "{text}");
    let busy = xtr()
        .args(["run", "-n", "--store", &dsn, "job", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(1));

    // An operator ends the holding session: the command is stopped, the exit code says lost.
    let backend = text
        .split("held by backend ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .unwrap()
        .to_owned();
    server.psql(&format!("SELECT pg_terminate_backend({backend})"));
    let status = wait_exit(&mut run, "run did not notice the lost lock");
    assert_eq!(status.code(), Some(3));
    wait_gone(pid, "the command of a lost lock");
}

#[test]
fn getlock_run_status_and_a_killed_connection_stops_the_command() {
    let server = MariaDbServer::start();
    let dsn = format!(
        "mysql+getlock{}?keepalive=0.2",
        server.url().strip_prefix("mysql").unwrap()
    );
    let tmp = tempfile::tempdir().unwrap();
    let (mut run, pid) = run_holding(&["run", "--store", &dsn, "job"], &tmp.path().join("pid"));
    let out = xtr()
        .args(["status", "--store", &dsn, "job"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("held by connection ") && text.contains("(write)"),
        "{text}"
    );
    assert!(text.contains("GET_LOCK name xtr-lock:"), "{text}");
    let busy = xtr()
        .args(["run", "-n", "--store", &dsn, "job", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(1));

    // An operator kills the holding connection: the command is stopped, exit 3.
    let id = text
        .split("held by connection ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .unwrap()
        .to_owned();
    server.sql(&format!("KILL {id}"));
    let status = wait_exit(&mut run, "run did not notice the lost lock");
    assert_eq!(status.code(), Some(3));
    wait_gone(pid, "the command of a lost lock");
}
