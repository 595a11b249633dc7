//! `run --limit N`: at most N commands at once on every store that counts, their environment,
//! `status --limit` showing used/limit and the holders; a store that cannot count says why.

use std::path::Path;
use std::process::Command;

use xtr_lock_testkit::redis::RedisServer;

use crate::common::{bin, flock_dsn, xtr};

/// The command each run executes: it marks itself inside, counts who is inside (never less
/// than were inside together: the last one in sees everyone), notes the count, stays a while,
/// and leaves.
const INSIDE: &str = "touch \"$D/in.$$\"; n=$(ls \"$D\"/in.* | wc -l); echo \"$n\" >> \"$D/counts\"; \
    [ \"$XTR_LOCK_LIMIT\" = 2 ] && [ \"$XTR_LOCK_PERMITS\" = 1 ] || echo bad-env >> \"$D/counts\"; \
    sleep 1; rm \"$D/in.$$\"";

/// Six runs at once with limit 2: never more than two commands inside, all six ran, and two
/// were inside together at some point.
fn six_runs_with_limit_two(dsn: &str) {
    let work = tempfile::tempdir().unwrap();
    let runs: Vec<_> = (0..6)
        .map(|_| {
            Command::new(bin())
                .args(["run", "--store", dsn, "--limit", "2", "-w", "60", "sem6"])
                .args(["--", "sh", "-c", INSIDE])
                .env("D", work.path())
                .env_remove("XTR_LOCK_STORE")
                .spawn()
                .unwrap()
        })
        .collect();
    for mut run in runs {
        let status = run.wait().unwrap();
        assert!(status.success(), "{status}");
    }
    let counts = std::fs::read_to_string(work.path().join("counts")).unwrap();
    let seen: Vec<u32> = counts
        .lines()
        .map(|l| l.parse().unwrap_or_else(|_| panic!("{counts}")))
        .collect();
    assert_eq!(seen.len(), 6, "{counts}");
    assert!(seen.iter().all(|n| *n <= 2), "more than 2 inside: {counts}");
    assert!(seen.contains(&2), "two ran together: {counts}");
}

/// `status --limit` while one run holds two of three permits.
fn status_shows_used_of_limit(dsn: &str, dir: &Path) {
    let ready = dir.join("ready");
    let mut run = Command::new(bin())
        .args([
            "run",
            "--store",
            dsn,
            "--limit",
            "3",
            "--permits",
            "2",
            "st",
        ])
        .args(["--", "sh", "-c", "touch \"$R\"; sleep 30"])
        .env("R", &ready)
        .env_remove("XTR_LOCK_STORE")
        .spawn()
        .unwrap();
    while !ready.exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = xtr()
        .args(["status", "--store", dsn, "--limit", "3", "st"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("2/3 permits used"), "{text}");
    assert!(text.contains("2 permits"), "{text}");
    let json = xtr()
        .args(["status", "--json", "--store", dsn, "--limit", "3", "st"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        (v["used"].as_u64(), v["limit"].as_u64()),
        (Some(2), Some(3)),
        "{v}"
    );
    let busy = xtr()
        .args([
            "run",
            "--store",
            dsn,
            "--limit",
            "3",
            "--permits",
            "2",
            "-n",
            "st",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(1), "2 + 2 > 3: {busy:?}");
    let mismatch = xtr()
        .args([
            "run", "--store", dsn, "--limit", "4", "-n", "st", "--", "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&mismatch.stderr);
    assert_eq!(mismatch.status.code(), Some(2), "{err}");
    assert!(
        err.contains("limit of 3") && err.contains("limit of 4"),
        "{err}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(run.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let _ = run.wait();
    let free = xtr()
        .args(["status", "--store", dsn, "--limit", "3", "st"])
        .output()
        .unwrap();
    assert_eq!(free.status.code(), Some(1), "{free:?}");
}

#[test]
fn redis_runs_never_exceed_the_limit() {
    let server = RedisServer::start();
    six_runs_with_limit_two(&server.url(0));
}

#[test]
fn flock_runs_never_exceed_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    six_runs_with_limit_two(&flock_dsn(dir.path()));
}

#[test]
fn redis_status_shows_used_of_limit() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    status_shows_used_of_limit(&server.url(0), dir.path());
}

#[test]
fn a_store_that_cannot_count_says_why() {
    let server = RedisServer::start();
    let dsn = format!("redis+pubsub://127.0.0.1:{}/0", server.port());
    let out = xtr()
        .args([
            "run", "--store", &dsn, "--limit", "2", "-n", "s", "--", "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("semaphores are not supported here"), "{err}");
    assert!(err.contains("portalocker"), "{err}");
}
