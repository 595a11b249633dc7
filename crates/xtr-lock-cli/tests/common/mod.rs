//! Helpers shared by the command's tests.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::cargo::CommandCargoExt as _;

pub(crate) mod jobs;
pub(crate) mod standby;

pub(crate) fn xtr() -> assert_cmd::Command {
    assert_cmd::Command::cargo_bin("xtr-lock").unwrap()
}

pub(crate) fn spawn(args: &[&str]) -> Child {
    Command::cargo_bin("xtr-lock")
        .unwrap()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Stops a running `xtr-lock run` as a user would (SIGTERM, forwarded to its command), so no
/// orphaned command outlives the test.
pub(crate) fn stop(mut run: Child) {
    let pid = rustix::process::Pid::from_raw(run.id() as i32).unwrap();
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    run.wait().unwrap();
}

pub(crate) fn flock_dsn(dir: &Path) -> String {
    format!("flock://{}", dir.display())
}

/// Waits until `status` says the resource is held (by anyone).
pub(crate) fn wait_held(store: &str, resource: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = xtr()
            .args(["status", "--store", store, resource])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("held by") {
            return;
        }
        assert!(Instant::now() < deadline, "{resource} never got held");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the command under `run` wrote its pid to `pidfile` (the lock is taken before the
/// command starts, so "held" is not "started"), and returns it.
pub(crate) fn command_pid(pidfile: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(pidfile).unwrap_or_default();
        if let Ok(pid) = text.trim().parse() {
            return pid;
        }
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `xtr-lock` with `run_args` (`run --store … RESOURCE`) and a command that writes its pid to
/// `pidfile` and sleeps a minute: the run, and the command's pid once it started.
pub(crate) fn run_holding(run_args: &[&str], pidfile: &Path) -> (Child, i32) {
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let mut args = run_args.to_vec();
    args.extend(["--", "sh", "-c", &script]);
    let run = spawn(&args);
    (run, command_pid(pidfile))
}

/// Whether process `pid` is running (a zombie is not).
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesized command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Whether a process of group `group` is running (a zombie is not).
pub(crate) fn running_in_group(group: i32) -> bool {
    let group = group.to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .any(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // "pid (comm) state ppid pgrp …"
            stat.rsplit_once(") ").is_some_and(|(_, rest)| {
                let fields: Vec<&str> = rest.split(' ').take(3).collect();
                fields.first() != Some(&"Z") && fields.get(2) == Some(&group.as_str())
            })
        })
}

/// Waits until `pid` is gone, failing after 10 s.
pub(crate) fn wait_gone(pid: i32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "{what}: pid {pid} is still running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (up to 20 s, failing with `what`) for `run` to exit; its exit status.
pub(crate) fn wait_exit(run: &mut Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = run.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `sig` to `pid`.
pub(crate) fn kill(pid: i32, sig: rustix::process::Signal) {
    let _ = rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), sig);
}

/// The path of the `xtr-lock` binary under test, for commands that call it themselves.
pub(crate) fn bin() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("xtr-lock")
}

/// Reads `child`'s stderr in a thread: returns its first line once written (failing after
/// 10 s), and a handle that yields the whole of it once the child closes it. For tests that must
/// act only after a waiter said it waits.
pub(crate) fn stderr_after_first_line(
    child: &mut Child,
) -> (String, std::thread::JoinHandle<String>) {
    use std::io::BufRead as _;
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            if all.is_empty() {
                let _ = tx.send(line.clone());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let first = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the child wrote no line on stderr within 10 s");
    (first, reader)
}
