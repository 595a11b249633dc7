//! `run`'s helpers are forked, not started: the watcher of the command's group and the
//! sentinel in `xtr-lock`'s group on flock, the command's supervisor on Redis are copies of
//! `xtr-lock` made at its start (one `fork`, no `exec`: the same command line), and no other
//! process is started besides the command (issue 38: each start of the executable cost 0.81 ms
//! of CPU). Later turns of `--standby` start them as before.

use std::path::Path;
use std::process::Child;

use xtr_lock_testkit::redis::RedisServer;

use crate::common::{bin, command_pid, flock_dsn, wait_exit};

/// A process's command line, as `/proc` has it.
fn cmdline(pid: i32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()
}

/// A process's parent and process group, from `/proc/PID/stat`.
fn parent_and_group(pid: i32) -> (i32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(") ").unwrap();
    let fields: Vec<&str> = rest.split(' ').collect();
    (fields[1].parse().unwrap(), fields[2].parse().unwrap())
}

/// The live processes of group `group` (zombies left out).
fn members(group: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.rsplit_once(") ").is_some_and(|(_, rest)| {
                let fields: Vec<&str> = rest.split(' ').collect();
                fields[0] != "Z" && fields[2] == group.to_string()
            })
        })
        .collect()
}

/// `xtr-lock run --store STORE r -- sh -c …` in a session of its own, its command writing its
/// pid and waiting for `done`: the run and the command's pid.
fn waiting_run(store: &str, tmp: &Path) -> (Child, i32) {
    let (pidfile, done) = (tmp.join("pid"), tmp.join("done"));
    let script = format!(
        "echo $$ > {}; while [ ! -e {} ]; do sleep 0.02; done",
        pidfile.display(),
        done.display()
    );
    let run = std::process::Command::new("setsid")
        .arg(bin())
        .args(["run", "--store", store, "r", "--", "sh", "-c", &script])
        .spawn()
        .expect("setsid (util-linux)");
    let pid = command_pid(&pidfile);
    (run, pid)
}

#[test]
fn on_flock_the_watcher_and_the_sentinel_are_forked_copies_of_xtr_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut run, command) = waiting_run(&flock_dsn(tmp.path()), tmp.path());
    let xtr = run.id() as i32; // setsid(1) execs it in place, at the head of a new group
    let (parent, watcher) = parent_and_group(command);
    assert_eq!(parent, xtr, "the command is xtr-lock's child");
    assert_ne!(watcher, xtr, "in a group of its own");
    assert_eq!(
        parent_and_group(watcher),
        (xtr, watcher),
        "led by the watcher"
    );
    assert_eq!(
        cmdline(watcher),
        cmdline(xtr),
        "the watcher is forked, not started as `xtr-lock __watch`"
    );
    let mut ours = members(xtr);
    ours.sort_unstable();
    assert_eq!(ours.len(), 2, "xtr-lock and its sentinel: {ours:?}");
    let sentinel = ours.into_iter().find(|&p| p != xtr).unwrap();
    assert_eq!(
        parent_and_group(sentinel),
        (watcher, xtr),
        "forked by the watcher"
    );
    assert_eq!(cmdline(sentinel), cmdline(xtr), "not `cat`");
    // Besides the command's own children (its `sleep`).
    let mut theirs: Vec<i32> = members(watcher)
        .into_iter()
        .filter(|&p| parent_and_group(p).0 != command)
        .collect();
    theirs.sort_unstable();
    assert_eq!(
        theirs,
        vec![watcher, command],
        "the watcher and the command"
    );
    std::fs::write(tmp.path().join("done"), b"").unwrap();
    assert!(wait_exit(&mut run, "the run ends").success());
}

#[test]
fn on_redis_the_supervisor_is_a_forked_copy_of_xtr_lock() {
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let (mut run, command) = waiting_run(&server.url(0), tmp.path());
    let xtr = run.id() as i32;
    let (supervisor, group) = parent_and_group(command);
    assert_eq!(
        group, supervisor,
        "the supervisor heads the command's group"
    );
    assert_eq!(parent_and_group(supervisor).0, xtr, "xtr-lock's child");
    assert_eq!(
        cmdline(supervisor),
        cmdline(xtr),
        "forked, not started as `xtr-lock __exec-child`"
    );
    assert_eq!(members(xtr), vec![xtr], "nothing else in xtr-lock's group");
    let env = std::fs::read(format!("/proc/{command}/environ")).unwrap();
    assert!(
        env.split(|&b| b == 0).any(|v| v == b"XTR_LOCK_RESOURCE=r"),
        "the command gets the lock's variables through the forked supervisor"
    );
    std::fs::write(tmp.path().join("done"), b"").unwrap();
    assert!(wait_exit(&mut run, "the run ends").success());
}

/// A run that needs no helper (its lock held elsewhere, `-n`: exit 1) leaves none behind: the
/// helper forked at its start ends when `xtr-lock` does.
#[test]
fn an_unneeded_helper_ends_with_xtr_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let (mut holder, _) = waiting_run(&store, tmp.path());
    let mut refused = std::process::Command::new("setsid")
        .arg(bin())
        .args(["run", "-n", "--store", &store, "r", "--", "true"])
        .spawn()
        .expect("setsid (util-linux)");
    let group = refused.id() as i32;
    assert_eq!(wait_exit(&mut refused, "the refused run").code(), Some(1));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !members(group).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: {:?}",
            members(group)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::fs::write(tmp.path().join("done"), b"").unwrap();
    assert!(wait_exit(&mut holder, "the holder's run ends").success());
}
