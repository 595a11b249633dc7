//! The throwaway PostgreSQL server: it starts (as an unprivileged user under root), answers,
//! keeps committed data over a restart, and a paused server answers nothing until resumed.

use std::time::{Duration, Instant};

use xtr_lock_testkit::postgres::PostgresServer;

#[test]
fn a_server_starts_answers_restarts_and_pauses() {
    let mut server = PostgresServer::start();
    assert_eq!(server.psql("SELECT 1"), "1");
    server.psql("CREATE TABLE kept (n INTEGER); INSERT INTO kept VALUES (7)");
    if rustix::process::geteuid().is_root() {
        let user = server.psql("SELECT current_setting('data_directory')");
        let owner = std::fs::metadata(&user).map(|m| std::os::unix::fs::MetadataExt::uid(&m));
        assert_ne!(owner.unwrap(), 0, "the cluster is not root's");
    }
    server.restart();
    assert_eq!(server.psql("SELECT n FROM kept"), "7");
    server.pause();
    let port = server.port().to_string();
    let started = Instant::now();
    let probe = std::process::Command::new("pg_isready")
        .args(["-h", "127.0.0.1", "-p", &port, "-t", "1"])
        .status()
        .unwrap();
    assert!(!probe.success(), "a paused server does not answer");
    assert!(started.elapsed() >= Duration::from_millis(900));
    server.resume();
    assert_eq!(server.psql("SELECT 2"), "2");
}
