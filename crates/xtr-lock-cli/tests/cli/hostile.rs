//! The command under hostile input: absurd durations, a stdout nobody reads, a relative lock
//! directory. Each test failed before its fix (a panic, a lock left held, exit 0).

use std::process::{Command, Stdio};

use assert_cmd::cargo::CommandCargoExt as _;
use xtr_lock_testkit::redis::RedisServer;

use crate::common;
use crate::common::xtr;

/// The stderr of a run that must fail with exit 2 (never a panic's 101).
fn fails_with_2(args: &[&str]) -> String {
    let out = xtr().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    stderr
}

#[test]
fn durations_past_the_maximum_are_refused_and_leave_no_lock() {
    let server = RedisServer::start();
    let store = server.url(0);
    for ttl in ["300000000000years", "10000000years", "3651days"] {
        let err = fails_with_2(&["run", "--store", &store, "--ttl", ttl, "j", "--", "true"]);
        assert!(err.contains("--ttl"), "{err}");
        assert_eq!(server.cli(&["EXISTS", "j"]), "0", "--ttl {ttl} left a lock");
    }
    let err = fails_with_2(&[
        "run",
        "-w",
        "10000000years",
        "--store",
        &store,
        "j",
        "--",
        "true",
    ]);
    assert!(err.contains("--wait"), "{err}");
    // refresh with a key: the bound is checked before the store is asked.
    let key = xtr()
        .args(["acquire", "--store", &store, "--ttl", "1m", "j"])
        .output()
        .unwrap();
    assert!(key.status.success());
    let key = String::from_utf8(key.stdout).unwrap();
    let err = fails_with_2(&[
        "refresh",
        "--store",
        &store,
        "--ttl",
        "300000000000years",
        key.trim(),
    ]);
    assert!(err.contains("--ttl"), "{err}");
    let pttl: i64 = server.cli(&["PTTL", "j"]).parse().unwrap();
    assert!(pttl > 0 && pttl <= 60_000, "the lease is untouched: {pttl}");
    // The longest accepted ttl works, and still expires.
    xtr()
        .args([
            "run", "--store", &store, "--ttl", "3650days", "k", "--", "true",
        ])
        .assert()
        .success();
    // A socket timeout past the bound is a configuration error, not a panic.
    let err = fails_with_2(&[
        "status",
        "--store",
        &format!("{store}?socket_timeout=1e30"),
        "j",
    ]);
    assert!(err.contains("socket_timeout"), "{err}");
}

#[test]
fn acquire_with_stdout_closed_takes_no_lock() {
    let server = RedisServer::start();
    let store = server.url(0);
    // `>&-`: the child starts with descriptor 1 closed.
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec \"$0\" acquire --store {store} --ttl 30s j >&-"
        ))
        .arg(common::bin())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("stdout is closed"), "{stderr}");
    assert_eq!(server.cli(&["EXISTS", "j"]), "0", "a lock was left");
    // `> /dev/null` is the caller's choice: it works.
    let status = Command::cargo_bin("xtr-lock")
        .unwrap()
        .args(["acquire", "--store", &store, "--ttl", "30s", "j"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_relative_flock_directory_is_refused() {
    let err = fails_with_2(&["run", "--store", "flock://rel/path", "j", "--", "true"]);
    assert!(err.contains("relative directory"), "{err}");
}

#[test]
fn long_file_names_are_a_dsn_option() {
    let dir = tempfile::tempdir().unwrap();
    let dsn = format!("flock://{}?names=long", dir.path().display());
    xtr()
        .args(["run", "--store", &dsn, "r", "--", "true"])
        .assert()
        .success();
    // The flock store's holder records (`.xtr-holders`, the metadata `run` gives) aside.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".xtr-"))
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert_eq!(
        names[0].len(),
        "xtr.r.".len() + 43 + ".lock".len(),
        "{names:?}"
    );
}

/// Processes whose environment carries `marker`.
fn marked(marker: &str) -> Vec<u32> {
    let needle = format!("XTR_TEST_MARK={marker}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let env = std::fs::read(e.path().join("environ")).ok()?;
            env.split(|b| *b == 0)
                .any(|v| v == needle.as_bytes())
                .then_some(pid)
        })
        .collect()
}

/// When `xtr-lock` is killed, its command's group is stopped and the supervisor exits with it:
/// it used to count itself (`/proc/self`) among the group's survivors and linger for the whole
/// grace (10 s).
#[test]
fn a_killed_xtr_lock_leaves_no_supervisor_behind() {
    let server = RedisServer::start();
    let marker = format!("{}", std::process::id());
    let mut run = Command::cargo_bin("xtr-lock")
        .unwrap()
        .args([
            "run",
            "--store",
            &server.url(0),
            "--ttl",
            "30s",
            "r",
            "--",
            "sleep",
            "60",
        ])
        .env("XTR_TEST_MARK", &marker)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while marked(&marker).len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    run.kill().unwrap();
    run.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !marked(&marker).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "still running 5 s after xtr-lock died (the grace is 10 s): {:?}",
            marked(&marker)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `config show | head -1`, `completions fish | head -3`: a reader that has what it wanted and
/// closes the pipe ends the command quietly (no panic, no backtrace), with status 0.
#[test]
fn a_reader_that_closes_the_pipe_early_ends_the_output_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("locks.toml");
    std::fs::write(&file, "[stores]\ndefault = \"in-memory\"\n").unwrap();
    let file = file.to_str().unwrap();
    for args in [
        &["config", "show", "--config", file][..],
        &["config", "show", "--json", "--config", file][..],
        &["completions", "fish"][..],
        &["completions", "bash"][..],
    ] {
        // The read end is closed before the command starts: its first write meets EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::cargo_bin("xtr-lock")
            .unwrap()
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
