//! `xtr-lock run`'s command lives and dies with the lock: it runs in its own process group,
//! keeps a flock lock through its own descriptor when `xtr-lock` is killed (as under
//! `flock(1)`), is stopped with its children when `xtr-lock` dies on a store where the lock dies
//! with it, and when the lock is lost; and a lost lock is exit 3 however it is found.

use std::path::Path;
use std::process::Child;

use rustix::process::Signal;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::{
    alive, bin, command_pid, flock_dsn, kill, running_in_group, spawn, wait_exit, wait_gone,
    wait_held, xtr,
};

/// `xtr-lock run OPTIONS --kill-after 1s r -- sh -c …` with a command that starts a child in
/// the background and waits for it (the shell does not `exec` it: a grandchild of `xtr-lock`);
/// the run, and the grandchild's pid once it runs.
fn run_with_grandchild(options: &[&str], tmp: &Path) -> (Child, i32) {
    let pidfile = tmp.join("pid");
    let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
    let mut args = vec!["run"];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--kill-after", "1s", "r", "--", "sh", "-c", &script]);
    let run = spawn(&args);
    (run, command_pid(&pidfile))
}

#[test]
fn the_command_runs_in_its_own_process_group() {
    let tmp = tempfile::tempdir().unwrap();
    let out = xtr()
        .args(["run", "--store", &flock_dsn(tmp.path()), "r", "--"])
        .args(["sh", "-c", "cut -d' ' -f5 /proc/$$/stat"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let group: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_ne!(
        group,
        rustix::process::getpgrp().as_raw_nonzero().get(),
        "not the group of whoever started xtr-lock"
    );
}

#[test]
fn killed_xtr_lock_on_flock_leaves_the_lock_held_until_the_command_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let (pidfile, done) = (tmp.path().join("pid"), tmp.path().join("done"));
    let script = format!(
        "echo $$ > {}; while [ ! -e {} ]; do sleep 0.05; done",
        pidfile.display(),
        done.display()
    );
    let mut run = spawn(&["run", "--store", &store, "r", "--", "sh", "-c", &script]);
    let command = command_pid(&pidfile);
    kill(run.id() as i32, Signal::KILL);
    run.wait().unwrap();
    assert!(alive(command), "the command goes on");
    xtr()
        .args(["run", "-n", "--store", &store, "r", "--", "true"])
        .assert()
        .code(1);
    std::fs::write(&done, b"").unwrap();
    wait_gone(command, "the command");
    xtr()
        .args(["run", "-n", "--store", &store, "r", "--", "true"])
        .assert()
        .success();
}

/// `xtr-lock ARGS` started by setsid(1), which makes it the leader of a new session and group
/// and execs it in place: the group's id is the run's pid.
fn setsid_run(args: &[&str]) -> Child {
    std::process::Command::new("setsid")
        .arg(bin())
        .args(args)
        .spawn()
        .expect("setsid (util-linux)")
}

/// The process group of the run `run`, which leads its own.
fn group_of(run: &Child) -> rustix::process::Pid {
    let group = rustix::process::Pid::from_raw(run.id() as i32).unwrap();
    assert_eq!(rustix::process::getpgid(Some(group)).unwrap(), group);
    group
}

/// As under flock(1), whose command shares its process group: killing the group of a `run`
/// started in a session of its own (a job, `setsid`, `timeout -s KILL`) stops the command and
/// its children, and the lock is free once they are gone. (Before: the command, alone in its own
/// group, ran on holding the lock until it ended.)
#[test]
fn killing_the_group_of_xtr_lock_on_flock_stops_the_command_and_frees_the_lock() {
    signal_to_the_group_stops_the_command(Signal::KILL);
}

/// The same with a signal that kills `xtr-lock` without being forwarded (SIGUSR1): its
/// watcher in the group dies of it too (it used to block it, and the command ran on).
#[test]
fn a_deadly_signal_to_the_group_of_xtr_lock_on_flock_stops_the_command() {
    signal_to_the_group_stops_the_command(Signal::USR1);
}

fn signal_to_the_group_stops_the_command(signal: Signal) {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let pidfile = tmp.path().join("pid");
    let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
    let mut run = setsid_run(&[
        "run",
        "--store",
        &store,
        "--kill-after",
        "1s",
        "r",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let grandchild = command_pid(&pidfile);
    rustix::process::kill_process_group(group_of(&run), signal).unwrap();
    run.wait().unwrap();
    wait_gone(
        grandchild,
        "the command's child, after xtr-lock's group was killed",
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !xtr()
        .args(["run", "-n", "--store", &store, "r", "true"])
        .output()
        .unwrap()
        .status
        .success()
    {
        assert!(std::time::Instant::now() < deadline, "the lock stayed held");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A signal that `xtr-lock` catches and forwards, sent to its whole group (`kill -- -PGID`,
/// `timeout`'s SIGTERM), reaches the command once, and the command stops its own way however
/// long that takes, as when only `xtr-lock` gets it: the group's sentinel, which such a signal
/// may kill, does not make the group look killed while `xtr-lock` lives (the command would be
/// told to stop again, then killed after --kill-after).
#[test]
fn a_forwarded_signal_to_the_group_of_xtr_lock_on_flock_leaves_the_command_to_stop_its_way() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let (pidfile, log) = (tmp.path().join("pid"), tmp.path().join("log"));
    // Its stop takes longer than the grace (and a second SIGTERM does not cut it short, but is
    // written down).
    let script = format!(
        "trap 'trap \"echo again >> {log}\" TERM; echo term >> {log}; \
         (trap \"\" TERM; sleep 0.5); echo done >> {log}; exit 0' TERM; \
         echo $$ > {pid}; while :; do sleep 0.05; done",
        log = log.display(),
        pid = pidfile.display()
    );
    let mut run = setsid_run(&[
        "run",
        "--store",
        &store,
        "--kill-after",
        "200ms",
        "r",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    command_pid(&pidfile);
    rustix::process::kill_process_group(group_of(&run), Signal::TERM).unwrap();
    let status = wait_exit(&mut run, "xtr-lock waits for the command");
    assert_eq!(status.code(), Some(0), "the command's own exit");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "term\ndone\n");
}

/// A command that writes down each SIGUSR1 to `log`, writes its pid to `pidfile`, and ends
/// (exit 0) once `done` exists; as `sh -c` arguments.
fn usr1_script(log: &Path, pidfile: &Path, done: &Path) -> String {
    format!(
        "trap 'echo usr1 >> {log}' USR1; echo $$ > {pid}; \
         while [ ! -e {done} ]; do sleep 0.05; done",
        log = log.display(),
        pid = pidfile.display(),
        done = done.display()
    )
}

/// Sends SIGUSR1 to the whole process group of the command whose pid is in `pidfile` (as to
/// rotate its logs: `kill -USR1 -- -PGID`), and waits until the command wrote it down in `log`.
/// Once the group's leader (the watcher, the supervisor) has started: in its first milliseconds
/// a signal sent to the group ends it, before it can catch or block it (docs/cli.md).
fn usr1_to_the_commands_group(pidfile: &Path, log: &Path) -> i32 {
    let command = command_pid(pidfile);
    let group = rustix::process::getpgid(rustix::process::Pid::from_raw(command)).unwrap();
    wait_catching(group.as_raw_nonzero().get(), Signal::USR1);
    rustix::process::kill_process_group(group, Signal::USR1).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(log).unwrap_or_default().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command got no USR1"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    command
}

/// Waits until process `pid` outlives `sig`: it catches it (a handler in place: `SigCgt` in its
/// status, the supervisor) or blocks it (`SigBlk`, the watcher).
fn wait_catching(pid: i32, sig: Signal) {
    let bit = 1u64 << (sig.as_raw() - 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let mask = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        };
        if [mask("SigCgt:"), mask("SigBlk:")]
            .into_iter()
            .any(|m| m.is_some_and(|m| m & bit != 0))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} never caught or blocked {sig:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A signal meant for the command and sent to its whole group ends neither the watcher of the
/// group (killing `xtr-lock`'s group afterwards still stops the command) nor the run (before,
/// on flock, it ended the supervisor heading the group: `xtr-lock` took that for the command's
/// exit, 138, and released the lock, the command running on).
#[test]
fn a_signal_to_the_commands_group_on_flock_leaves_it_watched_and_locked() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let [pidfile, log, done] = ["pid", "log", "done"].map(|f| tmp.path().join(f));
    let script = usr1_script(&log, &pidfile, &done);
    let mut run = setsid_run(&[
        "run",
        "--store",
        &store,
        "--kill-after",
        "1s",
        "r",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let command = usr1_to_the_commands_group(&pidfile, &log);
    xtr()
        .args(["run", "-n", "--store", &store, "r", "--", "true"])
        .assert()
        .code(1);
    rustix::process::kill_process_group(group_of(&run), Signal::KILL).unwrap();
    run.wait().unwrap();
    wait_gone(command, "the command, after xtr-lock's group was killed");
}

/// Where a supervisor heads the command's group (Redis), a signal meant for the command and
/// sent to the group does not end it: the run goes on, and ends with the command's own status.
#[test]
fn a_signal_to_the_commands_group_on_redis_leaves_the_run_to_the_command() {
    let server = RedisServer::start();
    let store = server.url(0);
    let tmp = tempfile::tempdir().unwrap();
    let [pidfile, log, done] = ["pid", "log", "done"].map(|f| tmp.path().join(f));
    let script = usr1_script(&log, &pidfile, &done);
    let mut run = spawn(&[
        "run", "--store", &store, "--ttl", "30s", "r", "--", "sh", "-c", &script,
    ]);
    usr1_to_the_commands_group(&pidfile, &log);
    xtr()
        .args(["run", "-n", "--store", &store, "r", "--", "true"])
        .assert()
        .code(1);
    std::fs::write(&done, b"").unwrap();
    let status = wait_exit(&mut run, "the run ends with its command");
    assert_eq!(status.code(), Some(0), "the command's own status");
}

/// Once a run on flock ended, nothing of it is left: neither in its own group (the sentinel)
/// nor in its command's (the watcher).
#[test]
fn a_run_on_flock_leaves_no_process_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pgid");
    let script = format!("cut -d' ' -f5 /proc/$$/stat > {}", pidfile.display());
    let store = flock_dsn(tmp.path());
    let mut run = setsid_run(&["run", "--store", &store, "r", "--", "sh", "-c", &script]);
    let ours = run.id() as i32; // a group of its own, once setsid(1) made it
    assert!(wait_exit(&mut run, "the run ends").success());
    let commands = command_pid(&pidfile);
    for group in [ours, commands] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while running_in_group(group) {
            assert!(
                std::time::Instant::now() < deadline,
                "group {group} still runs"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[test]
fn killed_xtr_lock_on_redis_stops_the_command_and_its_children() {
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let (mut run, grandchild) =
        run_with_grandchild(&["--store", &server.url(0), "--ttl", "30s"], tmp.path());
    kill(run.id() as i32, Signal::KILL);
    run.wait().unwrap();
    wait_gone(grandchild, "the command's child, after xtr-lock was killed");
}

#[test]
fn a_lost_lock_stops_the_commands_children_too() {
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let (run, grandchild) =
        run_with_grandchild(&["--store", &server.url(0), "--ttl", "600ms"], tmp.path());
    server.cli(&["DEL", "r"]); // behind its back
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("was lost: it was removed"), "{stderr}");
    wait_gone(grandchild, "the command's child, after the loss");
}

#[test]
fn a_replaced_lock_file_stops_the_command_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let (run, grandchild) = run_with_grandchild(&["--store", &store], tmp.path());
    wait_held(&store, "r");
    let lock_file = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("xtr."))
        })
        .expect("the lock file");
    std::fs::remove_file(&lock_file).unwrap();
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("lock file was removed or replaced"),
        "{stderr}"
    );
    wait_gone(grandchild, "the command's child");
}

#[test]
fn a_lock_lost_while_a_short_command_ran_is_exit_3() {
    // Observed before: exit 0, with another holder holding the lock.
    let server = RedisServer::start();
    let store = server.url(0);
    let script = format!(
        "redis-cli -p {port} del j >/dev/null; {xtr} acquire --store {store} --ttl 30s j >/dev/null; sleep .2",
        port = server.port(),
        xtr = bin().display(),
    );
    let out = xtr()
        .args([
            "run", "--store", &store, "--ttl", "30s", "j", "--", "sh", "-c", &script,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("was lost while the command ran"),
        "{stderr}"
    );
    assert_eq!(
        server.cli(&["ZCARD", "j"]),
        "2",
        "the other holder keeps its lock"
    );
}

#[test]
fn a_lock_whose_store_stays_unreachable_stops_the_command_saying_why() {
    let mut server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let store = format!(
        "{}?socket_connect_timeout=0.2&socket_timeout=0.2",
        server.url(0)
    );
    let (run, grandchild) = run_with_grandchild(&["--store", &store, "--ttl", "900ms"], tmp.path());
    server.kill();
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("could not be reached before its lifetime ran out"),
        "{stderr}"
    );
    assert!(
        stderr.contains("failed to define an expiration: "),
        "the refresh error and its cause: {stderr}"
    );
    wait_gone(grandchild, "the command's child, after the loss");
}

#[test]
fn the_supervisor_mode_is_not_for_users() {
    xtr()
        .args(["__exec-child", "nonsense"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("for xtr-lock run's own use"));
    // Its parent is not the one it names: it does not run the command.
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("ran");
    xtr()
        .args(["__exec-child", "1", "1000", "-", "--", "touch"])
        .arg(&marker)
        .assert()
        .code(3);
    assert!(!marker.exists());
}

#[test]
fn the_sentinel_and_watcher_modes_are_not_for_users() {
    // A pipe is a FIFO too: it is not the one the sentinel was named.
    let tmp = tempfile::tempdir().unwrap();
    xtr()
        .args(["__sentinel"])
        .arg(tmp.path())
        .assert()
        .code(2)
        .stderr(predicates::str::contains("for xtr-lock run's own use"));
    xtr()
        .args(["__watch", "1", "1000", "0:0"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("for xtr-lock run's own use"));
}

/// Where there is no `/bin/cat`, this executable stands for it as the sentinel: it ends when
/// its pipe has no writer left.
#[test]
fn the_sentinel_mode_waits_for_the_end_of_its_pipe() {
    let (reader, writer) = std::io::pipe().unwrap();
    let st = rustix::fs::fstat(&reader).unwrap();
    let mut sentinel = std::process::Command::new(bin())
        .arg("__sentinel")
        .arg(format!("{}:{}", st.st_dev, st.st_ino))
        .stdin(reader)
        .spawn()
        .unwrap();
    drop(writer);
    assert!(wait_exit(&mut sentinel, "the sentinel ends").success());
}
