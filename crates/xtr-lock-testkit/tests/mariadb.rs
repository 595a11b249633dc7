//! The throwaway MariaDB server: it starts, answers, keeps committed data over a kill and
//! restart, and a paused server answers nothing until resumed.

use std::time::Duration;

use xtr_lock_testkit::mariadb::MariaDbServer;

#[test]
fn a_server_starts_answers_survives_a_kill_and_pauses() {
    let mut server = MariaDbServer::start();
    assert_eq!(server.sql("SELECT 1"), "1");
    server.sql("CREATE TABLE xtr.kept (n INT) ENGINE = InnoDB; INSERT INTO xtr.kept VALUES (7)");
    server.restart();
    assert_eq!(server.sql("SELECT n FROM xtr.kept"), "7");
    server.pause();
    let port = server.port().to_string();
    let probe = std::process::Command::new("mariadb-admin")
        .args([
            "--no-defaults",
            "-h",
            "127.0.0.1",
            "-P",
            &port,
            "-u",
            "root",
        ])
        .args(["--connect-timeout=1", "ping"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!probe.success(), "a paused server does not answer");
    server.resume();
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(server.sql("SELECT 2"), "2");
}
