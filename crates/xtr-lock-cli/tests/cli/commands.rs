//! The `xtr-lock` command as users run it: exit codes, exclusion between concurrent runs, shared
//! mode, signals, keys handed between processes, status, bench.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use predicates::prelude::*;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::{command_pid, flock_dsn, spawn, stop, wait_held, xtr};

// ---- exit codes ---------------------------------------------------------------------------------

#[test]
fn run_passes_the_commands_status_and_environment_on() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    xtr()
        .args(["run", "--store", &store, "job", "--", "sh", "-c"])
        .arg(
            "echo \"$XTR_LOCK_RESOURCE $XTR_LOCK_SCHEME $XTR_LOCK_MODE ${XTR_LOCK_FENCING_TOKEN:-none} \
             ${XTR_LOCK_STORE:-unset} $XTR_LOCK_LOCATION\"; exit 7",
        )
        .env_remove("XTR_LOCK_STORE")
        .assert()
        .code(7)
        .stdout(format!(
            "job flock write none {store} {}/xtr.job.XoyZAiB.lock\n",
            tmp.path().display()
        ));
    xtr()
        .args(["run", "--store", &store, "job", "--", "true"])
        .assert()
        .success();
    xtr()
        .args([
            "run",
            "--store",
            "in-memory",
            "job",
            "--",
            "sh",
            "-c",
            "echo $XTR_LOCK_FENCING_TOKEN",
        ])
        .assert()
        .success()
        .stdout("1\n");
}

#[test]
fn a_held_lock_gives_exit_1_with_nonblock_or_e_or_after_wait() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let holder = spawn(&["run", "--store", &store, "busy", "--", "sleep", "5"]);
    wait_held(&store, "busy");
    xtr()
        .args(["run", "-n", "--store", &store, "busy", "--", "true"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("\"busy\" is held by someone else"));
    xtr()
        .args([
            "run", "-n", "-E", "42", "--store", &store, "busy", "--", "true",
        ])
        .assert()
        .code(42);
    let started = Instant::now();
    xtr()
        .args([
            "run", "-w", "300ms", "-q", "--store", &store, "busy", "--", "true",
        ])
        .assert()
        .code(1)
        .stderr("");
    assert!(started.elapsed() >= Duration::from_millis(300));
    stop(holder);
}

#[test]
fn usage_and_configuration_errors_exit_2_with_one_clear_line_and_no_secret() {
    xtr().args(["run", "r"]).assert().code(2); // no command
    xtr()
        .args([
            "run",
            "--store",
            "memcached://app:hunter2@db",
            "r",
            "--",
            "true",
        ])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("xtr-lock: error: --store")
                .and(predicate::str::contains("hunter2").not()),
        );
    xtr()
        .args([
            "run",
            "--store",
            "redis://u:hunter2@h:notaport",
            "r",
            "--",
            "true",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("hunter2").not());
    xtr()
        .args(["run", "-w", "soon", "r", "--", "true"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--wait \"soon\" is not a duration",
        ));
    xtr()
        .args([
            "run",
            "--store",
            "redis://127.0.0.1:1/0?socket_connect_timeout=1",
            "r",
            "--",
            "true",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("xtr-lock: error: "));
    xtr()
        .args(["run", "r", "--", "/no/such/command"])
        .assert()
        .code(127);
}

// ---- exclusion ------------------------------------------------------------------------------------

/// Runs `n` concurrent `run`s whose commands log `start NS` / `end NS`, and returns the
/// intervals.
fn intervals(store: &str, extra: &[&str], n: usize, log: &Path) -> Vec<(u128, u128)> {
    let script = format!(
        "echo start $(date +%s%N) $$ >> {0}; sleep 0.2; echo end $(date +%s%N) $$ >> {0}",
        log.display()
    );
    let children: Vec<Child> = (0..n)
        .map(|_| {
            let mut args = vec!["run", "--store", store];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["shared-work", "--", "sh", "-c", &script]);
            spawn(&args)
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(log).unwrap();
    let mut starts = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (what, at, pid) = (parts[0], parts[1].parse::<u128>().unwrap(), parts[2]);
        if what == "start" {
            starts.insert(pid.to_owned(), at);
        } else {
            out.push((starts[pid], at));
        }
    }
    out.sort_unstable();
    out
}

#[test]
fn concurrent_runs_on_one_resource_never_overlap() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    let spans = intervals(&flock_dsn(tmp.path()), &[], 4, &log);
    assert_eq!(spans.len(), 4);
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap: {spans:?}");
    }
}

#[test]
fn shared_runs_overlap_and_exclude_a_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let log = tmp.path().join("log");
    let spans = intervals(&store, &["-s"], 3, &log);
    let latest_start = spans.iter().map(|s| s.0).max().unwrap();
    let earliest_end = spans.iter().map(|s| s.1).min().unwrap();
    assert!(
        latest_start < earliest_end,
        "readers ran together: {spans:?}"
    );

    let reader = spawn(&["run", "-s", "--store", &store, "rw", "--", "sleep", "5"]);
    wait_held(&store, "rw");
    xtr()
        .args(["run", "-n", "-s", "--store", &store, "rw", "--", "true"])
        .assert()
        .success();
    xtr()
        .args(["run", "-n", "--store", &store, "rw", "--", "true"])
        .assert()
        .code(1);
    stop(reader);
}

/// Whether process `pid` has a lock file of the flock store in `dir` open.
fn has_open_lock_file(pid: u32, dir: &Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|target| {
            target.parent() == Some(dir)
                && target
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("xtr."))
        })
}

// ---- signals --------------------------------------------------------------------------------------

#[test]
fn the_lock_is_released_when_the_command_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let pidfile = tmp.path().join("pid");
    let mut run = spawn(&[
        "run",
        "--store",
        &store,
        "victim",
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 30", pidfile.display()),
    ]);
    let pid: i32 = command_pid(&pidfile);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 9), "128 + SIGKILL");
    xtr()
        .args(["run", "-n", "--store", &store, "victim", "--", "true"])
        .assert()
        .success();
}

#[test]
fn sigterm_to_xtr_lock_is_forwarded_and_the_lock_released() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let pidfile = tmp.path().join("pid");
    let mut run = spawn(&[
        "run",
        "--store",
        &store,
        "term",
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 30", pidfile.display()),
    ]);
    command_pid(&pidfile);
    let pid = rustix::process::Pid::from_raw(run.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = run.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "the command died of the forwarded SIGTERM"
    );
    xtr()
        .args(["run", "-n", "--store", &store, "term", "--", "true"])
        .assert()
        .success();
}

#[test]
fn sigterm_while_waiting_ends_the_wait_and_leaves_nothing_held() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let holder = spawn(&["run", "--store", &store, "queue", "--", "sleep", "30"]);
    wait_held(&store, "queue");
    let marker = tmp.path().join("ran");
    let mut waiter = spawn(&[
        "run",
        "--store",
        &store,
        "queue",
        "--",
        "touch",
        marker.to_str().unwrap(),
    ]);
    // A waiter on a file lock keeps the lock file open while it waits (its signal handlers are
    // set before it starts waiting): wait for that, not for a while.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !has_open_lock_file(waiter.id(), tmp.path()) {
        assert!(
            Instant::now() < deadline,
            "the waiter never started waiting"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = rustix::process::Pid::from_raw(waiter.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert_eq!(waiter.wait().unwrap().code(), Some(128 + 15));
    assert!(!marker.exists(), "the command never ran");
    stop(holder);
    xtr()
        .args(["run", "-n", "--store", &store, "queue", "--", "true"])
        .assert()
        .success();
}

#[test]
fn a_lost_lock_stops_the_command_and_exits_3() {
    let server = RedisServer::start();
    let store = server.url(0);
    let run = spawn(&[
        "run",
        "--store",
        &store,
        "--ttl",
        "600ms",
        "--kill-after",
        "1s",
        "lost",
        "--",
        "sleep",
        "30",
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.cli(&["EXISTS", "lost"]) != "1" {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    server.cli(&["DEL", "lost"]); // taken behind its back
    let started = Instant::now();
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(started.elapsed() < Duration::from_secs(10));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("was lost") && stderr.contains("SIGTERM"),
        "{stderr}"
    );
}

#[test]
fn run_keeps_an_expiring_lock_alive_while_the_command_runs() {
    let server = RedisServer::start();
    let store = server.url(0);
    xtr()
        .args([
            "run", "--store", &store, "--ttl", "300ms", "long", "--", "sleep", "1.2",
        ])
        .assert()
        .success();
    assert_eq!(server.cli(&["EXISTS", "long"]), "0", "released at the end");
}

// ---- keys between processes -----------------------------------------------------------------------

#[test]
fn acquire_in_one_process_release_in_another() {
    let server = RedisServer::start();
    let store = format!("redis://127.0.0.1:{}/0", server.port());
    let out = xtr()
        .args(["acquire", "--store", &store, "--ttl", "1m", "handed"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap();
    xtr()
        .args(["acquire", "-n", "--store", &store, "handed"])
        .assert()
        .code(1);
    xtr()
        .args(["status", "--store", &store, "--key", key.trim()])
        .assert()
        .success()
        .stdout(predicate::str::contains("held by this key"));
    xtr()
        .args(["refresh", "--store", &store, "--ttl", "2m"])
        .write_stdin(key.clone())
        .assert()
        .success();
    xtr()
        .args(["release", "--store", &store])
        .write_stdin(key.clone())
        .assert()
        .success();
    xtr()
        .args(["status", "--store", &store, "handed"])
        .assert()
        .code(1)
        .stdout(
            "\"handed\": free\nlock: key \"handed\" in redis://127.0.0.1:PORT/0\n"
                .replace("PORT", &server.port().to_string()),
        );
    xtr()
        .args(["release", "--store", &store, key.trim()])
        .assert()
        .code(3);
    xtr()
        .args(["release", "--store", &store, "{\"v\":1}"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "is not one `xtr-lock acquire` printed",
        ));
}

#[test]
fn keys_of_process_local_stores_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for store in [flock_dsn(tmp.path()), "in-memory".to_owned()] {
        xtr()
            .args(["acquire", "--store", &store, "local"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(
                "cannot be handed to another process",
            ));
    }
}

// ---- status, bench, help ----------------------------------------------------------------------------

#[test]
fn status_shows_the_holders_pid_and_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let holder = spawn(&["run", "--store", &store, "watched", "--", "sleep", "5"]);
    wait_held(&store, "watched");
    xtr()
        .args(["status", "--store", &store, "watched"])
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "pid {} (write)",
            holder.id()
        )));
    let out = xtr()
        .args(["status", "--json", "--store", &store, "watched"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "held");
    assert_eq!(v["holders"][0]["pid"], holder.id());
    stop(holder);
}

#[test]
fn bench_prints_sane_numbers_for_memory_and_flock() {
    let tmp = tempfile::tempdir().unwrap();
    for store in ["in-memory".to_owned(), flock_dsn(tmp.path())] {
        let out = xtr()
            .args([
                "bench",
                "--json",
                "--duration",
                "300ms",
                "--clients",
                "4",
                "--resources",
                "2",
                "--store",
                &store,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for what in ["uncontended_us", "handoff_us"] {
            let p50 = v[what]["p50"].as_f64().unwrap();
            let p99 = v[what]["p99"].as_f64().unwrap();
            assert!(p50 > 0.0 && p50 <= p99 && p99 < 1e6, "{store} {what}: {v}");
        }
        assert!(
            v["throughput"]["per_second"].as_f64().unwrap() > 100.0,
            "{store}: {v}"
        );
    }
    xtr()
        .args(["bench", "--store", "in-memory", "--duration", "100ms"])
        .assert()
        .success()
        .stdout(predicate::str::contains("uncontended acquire + release"));
}

#[test]
fn help_has_examples_and_the_exit_codes_and_completions_work() {
    xtr().arg("--help").assert().success().stdout(
        predicate::str::contains("Exit codes:")
            .and(predicate::str::contains("xtr-lock run nightly-report")),
    );
    xtr()
        .args(["completions", "bash"])
        .assert()
        .success()
        .stdout(predicate::str::contains("xtr-lock"));
}

/// `status` speaks for the quorum: the holder a majority of servers agree on.
fn status_speaks_for_the_quorum(dsns: &[String]) {
    let stores: Vec<String> = dsns
        .iter()
        .flat_map(|d| ["--store".into(), d.clone()])
        .collect();
    let key = xtr()
        .arg("acquire")
        .args(&stores)
        .args(["--ttl", "1m", "held"])
        .output()
        .unwrap();
    assert!(
        key.status.success(),
        "{}",
        String::from_utf8_lossy(&key.stderr)
    );
    xtr()
        .arg("status")
        .args(&stores)
        .arg("held")
        .assert()
        .success()
        .stdout(
            predicate::str::is_match(
                r#"^"held": held by holder [0-9a-f]{12} \(write, \d+s left\)\n(?:  .*\n)*lock: key "held" in redis://127.0.0.1:\d+/0; key "held" in "#,
            )
            .unwrap(),
        );
    xtr()
        .arg("release")
        .args(&stores)
        .write_stdin(key.stdout)
        .assert()
        .success();
    xtr()
        .arg("status")
        .args(&stores)
        .arg("held")
        .assert()
        .code(1)
        .stdout(predicate::str::starts_with(
            "\"held\": free\nlock: key \"held\"",
        ));
}

#[test]
fn a_repeated_store_is_a_quorum() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let dsns: Vec<String> = servers
        .iter()
        .map(|s| format!("{}?socket_connect_timeout=0.5&socket_timeout=0.5", s.url(0)))
        .collect();
    let mut args = vec!["run".to_owned()];
    for d in &dsns {
        args.push("--store".into());
        args.push(d.clone());
    }
    args.extend([
        "q".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        "echo $XTR_LOCK_SCHEME".into(),
    ]);
    xtr()
        .args(&args)
        .assert()
        .success()
        .stdout("combined(redis,redis,redis)\n");
    // The release answers at the quorum; every server has its release all the same. (On
    // loopback the slowest server's release has usually been sent before the process exits
    // even without `close`, so this does not prove `close` waits: the library's
    // tests/stores/combined.rs does.)
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(server.cli(&["EXISTS", "q"]), "0", "server {i} still holds");
    }
    status_speaks_for_the_quorum(&dsns);
    servers[0].kill();
    xtr().args(&args).assert().success();
    servers[1].kill();
    // Two of three down: an outage (exit 2, saying so), not "held by someone else" (exit 1).
    let mut nonblock = args.clone();
    nonblock.insert(1, "-n".into());
    xtr()
        .args(&nonblock)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("2 of 3 stores failed"));
}
