//! `run --standby` on flock and Redis: turns that never overlap (terms increasing where the
//! store fences), fail-over after the leader's xtr-lock is SIGKILLed, `--max-restarts` with
//! the back-off, and `leader --watch` seeing each change in order.

use std::time::{Duration, Instant};

use xtr_lock_testkit::redis::RedisServer;

use crate::common::standby::{
    AT_ONCE, after_ttl, failover, leader_sees_each_change_in_order,
    leftovers_are_stopped_between_turns, turns_never_overlap,
};
use crate::common::{flock_dsn, xtr};

#[test]
fn flock_standbys_take_turns_without_overlap() {
    let dir = tempfile::tempdir().unwrap();
    turns_never_overlap(&flock_dsn(dir.path()), &[], 30, false);
}

#[test]
fn redis_standbys_take_turns_with_increasing_terms() {
    let server = RedisServer::start();
    turns_never_overlap(&server.url(0), &["--ttl", "5s"], 30, true);
}

/// Review finding: what a turn left running in the background ran beside the next turn.
#[test]
fn flock_stops_a_turns_leftovers_before_the_next() {
    let dir = tempfile::tempdir().unwrap();
    leftovers_are_stopped_between_turns(&flock_dsn(dir.path()), &[]);
}

#[test]
fn redis_stops_a_turns_leftovers_before_the_next() {
    let server = RedisServer::start();
    leftovers_are_stopped_between_turns(&server.url(0), &["--ttl", "5s"]);
}

#[test]
fn flock_fails_over_at_once() {
    let dir = tempfile::tempdir().unwrap();
    failover(&flock_dsn(dir.path()), &[], AT_ONCE);
}

#[test]
fn redis_fails_over_within_the_ttl() {
    let server = RedisServer::start();
    failover(&server.url(0), &["--ttl", "2s"], after_ttl(2));
}

#[test]
fn max_restarts_stops_a_failing_command_after_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let script = format!("echo run >> {}; exit 3", runs.display());
    let started = Instant::now();
    let out = xtr()
        .args(["run", "--standby", "--max-restarts", "2", "-v"])
        .args([
            "--store",
            &flock_dsn(dir.path()),
            "crashy",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let count = std::fs::read_to_string(&runs).unwrap().lines().count();
    assert_eq!(count, 3, "{stderr}");
    // Two quick failures: a back-off of 1s, then 2s.
    assert!(started.elapsed() >= Duration::from_secs(3), "{stderr}");
    assert_eq!(
        stderr.matches("xtr-lock: leading \"crashy\"").count(),
        3,
        "{stderr}"
    );
    assert!(stderr.contains("stopped leading \"crashy\": the command exited with status 3"));
    assert!(stderr.contains("campaigning again in 2s"), "{stderr}");
}

/// Review finding: a command that succeeds at once made the standby spin.
#[test]
fn quick_successes_back_off() {
    let dir = tempfile::tempdir().unwrap();
    let out = xtr()
        .args(["run", "--standby", "--max-restarts", "1", "-v"])
        .args(["--store", &flock_dsn(dir.path()), "quick", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("campaigning again in 100ms"), "{stderr}");
}

#[test]
fn standby_refuses_nonblock_and_wait() {
    for flag in [&["-n"][..], &["-w", "3"]] {
        let out = xtr()
            .args(["run", "--standby"])
            .args(flag)
            .args(["r", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot be used with"), "{err}");
    }
}

#[test]
fn leader_watch_prints_each_change_in_order() {
    let dir = tempfile::tempdir().unwrap();
    leader_sees_each_change_in_order(&flock_dsn(dir.path()));
}

#[test]
fn redis_leader_watch_prints_each_change_in_order() {
    let server = RedisServer::start();
    leader_sees_each_change_in_order(&server.url(0));
}
