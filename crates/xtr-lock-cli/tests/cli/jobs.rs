//! Jobs on many machines: `--min-hold`, `--max-hold`, `--on-conflict` and `revoke`, on flock
//! (the lock ends with its holder) and on a Redis the testkit starts (locks expire).

use std::path::Path;

use rustix::process::Signal;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::jobs::{
    max_hold_stops_the_command, min_hold_held_by_xtr_lock, min_hold_left_to_the_store,
    queue_one_runs_at_most_twice, run_inside, staggered_starts_run_once, stderr_of, try_run,
    wait_for_file,
};
use crate::common::{flock_dsn, kill, spawn, wait_exit, wait_gone, xtr};

#[test]
fn contradictory_policies_are_refused_in_one_line() {
    for (args, says) in [
        (
            &["-n", "--on-conflict", "replace"][..],
            "contradicts --on-conflict replace",
        ),
        (&["--on-conflict", "skip", "-w", "5"][..], "-w 5 waits"),
        (
            &["--min-hold", "0"][..],
            "--min-hold must be more than zero",
        ),
        (
            &["--max-hold", "soon"][..],
            "--max-hold \"soon\" is not a duration",
        ),
        (&["--on-conflict", "later"][..], "invalid value 'later'"),
        (
            &["--on-conflict", "replace", "--limit", "2"][..],
            "permits (--limit) are not revoked",
        ),
    ] {
        let out = xtr()
            .arg("run")
            .args(args)
            .args(["r", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = xtr()
        .args(["acquire", "--fd", "0", "--on-conflict", "queue-one", "r"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn flock_holds_a_minimum_hold_itself() {
    let tmp = tempfile::tempdir().unwrap();
    min_hold_held_by_xtr_lock(&flock_dsn(tmp.path()), "min", tmp.path());
}

#[test]
fn a_signal_ends_the_minimum_hold_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let marker = tmp.path().join("done");
    let script = format!("touch {}", marker.display());
    let mut run = spawn(&[
        "run",
        "--store",
        &store,
        "--min-hold",
        "1h",
        "min",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    wait_for_file(&marker);
    assert_eq!(try_run(&store, "min"), Some(1));
    kill(run.id() as i32, Signal::TERM);
    let status = wait_exit(&mut run, "SIGTERM did not end the minimum hold");
    assert_eq!(status.code(), Some(0), "{}", stderr_of(&mut run));
    assert_eq!(try_run(&store, "min"), Some(0));
}

#[test]
fn redis_leaves_a_minimum_hold_to_the_server() {
    let server = RedisServer::start();
    min_hold_left_to_the_store(&server.url(0), "min");
}

/// Runs `scenario` on a flock directory and on a throwaway Redis server (its DSN, a temporary
/// directory of its own).
fn on_flock_and_redis(scenario: impl Fn(&str, &Path)) {
    let tmp = tempfile::tempdir().unwrap();
    scenario(&flock_dsn(tmp.path()), tmp.path());
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    scenario(&server.url(0), tmp.path());
}

#[test]
fn staggered_starts_run_the_job_once() {
    on_flock_and_redis(|store, tmp| staggered_starts_run_once(store, "hourly", tmp));
}

#[test]
fn max_hold_stops_the_command_and_frees_the_lock() {
    let flags = ["--max-hold", "1s"];
    on_flock_and_redis(|store, tmp| max_hold_stops_the_command(store, "max", tmp, &flags));
    // Renewed up to the maximum hold: the last lease ends MAX_HOLD_GRACE after it, and the
    // command is stopped before it does (by run, or by its supervisor): exit 4 either way.
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let flags = ["--ttl", "3", "--max-hold", "4s", "--kill-after", "1s"];
    max_hold_stops_the_command(&server.url(0), "renewed", tmp.path(), &flags);
}

#[test]
fn queue_one_buffers_one_run() {
    on_flock_and_redis(|store, tmp| queue_one_runs_at_most_twice(store, "q", tmp));
}

/// `replace` revokes the running `run` (exit 3, `why: revoked`; a holder sees a notice at its
/// next renewal: a ttl of 3 s renews every second), which stops its command before the new
/// command starts.
#[test]
fn replace_stops_the_running_command_and_runs_the_new_one() {
    let server = RedisServer::start();
    let store = server.url(0);
    let tmp = tempfile::tempdir().unwrap();
    let inside = tmp.path().join("inside");
    let (mut old, pid) = run_inside(
        &store,
        "deploy",
        &["--ttl", "3", "--json", "--kill-after", "5s"],
        &inside,
        &tmp.path().join("pid"),
    );
    wait_for_file(&inside);
    let (overlap, ran) = (tmp.path().join("overlap"), tmp.path().join("ran"));
    let script = format!(
        "if [ -e {} ]; then touch {}; fi; touch {}",
        inside.display(),
        overlap.display(),
        ran.display()
    );
    let new = xtr()
        .args([
            "run",
            "--store",
            &store,
            "--on-conflict",
            "replace",
            "-w",
            "20",
        ])
        .args(["deploy", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        new.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&new.stderr)
    );
    let status = wait_exit(&mut old, "the replaced run did not exit");
    let err = stderr_of(&mut old);
    assert_eq!(status.code(), Some(3), "{err}");
    assert!(err.contains(r#""why":"revoked""#), "{err}");
    wait_gone(pid, "the replaced command");
    assert!(ran.exists(), "the new command did not run");
    assert!(
        !overlap.exists(),
        "the new command ran while the old one did"
    );
}

#[test]
fn revoke_says_whether_the_holders_let_go() {
    let server = RedisServer::start();
    let store = server.url(0);
    let revoke = |wait: &str, json: bool| {
        let mut cmd = xtr();
        cmd.args(["revoke", "--store", &store, "-w", wait, "job"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = revoke("1", false);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("nobody to ask"), "{text}");

    let tmp = tempfile::tempdir().unwrap();
    let (mut run, pid) = run_inside(
        &store,
        "job",
        &["--ttl", "3"],
        &tmp.path().join("inside"),
        &tmp.path().join("pid"),
    );
    let (code, text) = revoke("20", false);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("asked 1 holder") && text.contains("free now"),
        "{text}"
    );
    assert_eq!(
        wait_exit(&mut run, "the revoked run did not exit").code(),
        Some(3)
    );
    wait_gone(pid, "the revoked command");

    // A key from `acquire` is watched by nobody: it cannot be asked, and stays held.
    let key = xtr()
        .args(["acquire", "--store", &store, "--ttl", "30", "job"])
        .output()
        .unwrap();
    assert!(key.status.success());
    let (code, text) = revoke("0.5", true);
    assert_eq!(code, Some(1), "{text}");
    let answer: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(answer["asked"], 1, "{text}");
    assert_eq!(answer["let_go"], false, "{text}");
    xtr()
        .args(["release", "--store", &store])
        .write_stdin(key.stdout)
        .assert()
        .success();
    let out = xtr()
        .args(["revoke", "-w", "soon", "job"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// On flock a holder learns of a notice as the store tells of changes, or looks once a second
/// (docs/jobs.md): `revoke -w 5` reaches a watching `run`.
#[test]
fn revoke_reaches_a_flock_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let (mut run, pid) = run_inside(
        &store,
        "job",
        &[],
        &tmp.path().join("inside"),
        &tmp.path().join("pid"),
    );
    let out = xtr()
        .args(["revoke", "--store", &store, "-w", "5", "job"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.code() != Some(0) {
        // Not left running for a minute after the test.
        crate::common::stop(run);
        panic!("revoke exited {:?}: {text}", out.status.code());
    }
    assert_eq!(
        wait_exit(&mut run, "the revoked run did not exit").code(),
        Some(3)
    );
    wait_gone(pid, "the revoked command");
}

/// `acquire --on-conflict replace` takes the lock from a running `run` (which exits 3) and
/// prints its key; `acquire --on-conflict queue-one` waits as the one queued run.
#[test]
fn acquire_takes_the_policies_too() {
    let server = RedisServer::start();
    let store = server.url(0);
    let tmp = tempfile::tempdir().unwrap();
    let (mut run, pid) = run_inside(
        &store,
        "job",
        &["--ttl", "3"],
        &tmp.path().join("inside"),
        &tmp.path().join("pid"),
    );
    let out = xtr()
        .args([
            "acquire",
            "--store",
            &store,
            "--on-conflict",
            "replace",
            "-w",
            "20",
        ])
        .args(["--ttl", "30", "job"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        wait_exit(&mut run, "the replaced run did not exit").code(),
        Some(3)
    );
    wait_gone(pid, "the replaced command");
    // Held by that key: one acquire queues behind it, a second is refused.
    let mut queued = spawn(&[
        "acquire",
        "--store",
        &store,
        "--on-conflict",
        "queue-one",
        "--ttl",
        "30",
        "job",
    ]);
    // Once it holds the queue slot, another is refused at once, whatever its wait.
    crate::common::wait_held(&store, "job#xtr-queue");
    let refused = xtr()
        .args([
            "acquire",
            "--store",
            &store,
            "--on-conflict",
            "queue-one",
            "-w",
            "20",
            "job",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("another run already waits"), "{err}");
    assert_eq!(refused.status.code(), Some(1));
    xtr()
        .args(["release", "--store", &store])
        .write_stdin(out.stdout)
        .assert()
        .success();
    let status = wait_exit(&mut queued, "the queued acquire did not get the lock");
    assert!(status.success(), "{}", stderr_of(&mut queued));
}
