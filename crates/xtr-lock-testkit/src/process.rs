//! What the server helpers share about the processes they start.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// The pid of `child`.
pub(crate) fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("a pid")).expect("a pid")
}

/// Waits until `ready` says the server `what` answers, failing with its log when it exits first
/// or is not up `within`.
pub(crate) fn wait_up(
    child: &mut Child,
    what: &str,
    log: &Path,
    within: Duration,
    mut ready: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + within;
    while !ready() {
        let log = || std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            child.try_wait().ok().flatten().is_none(),
            "{what} exited; its log: {}",
            log()
        );
        assert!(
            Instant::now() < deadline,
            "{what} did not come up within {within:?}; its log: {}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGSTOP to `pid`, returning once every thread of it has stopped: a thread already running
/// could otherwise still answer a request sent just after the signal (seen with memcached's
/// worker threads). `Err` when the signal could not be sent; a process that exits meanwhile
/// counts as stopped.
pub(crate) fn stop(pid: Pid) -> rustix::io::Result<()> {
    kill_process(pid, Signal::STOP)?;
    let tasks = format!("/proc/{}/task", pid.as_raw_nonzero());
    let deadline = Instant::now() + Duration::from_secs(10);
    // Stopped, or exited (a zombie, or dead): either way it answers nothing more. A server
    // whose worker process is exiting as it is paused (PostgreSQL's, after a restart) would
    // otherwise never be seen stopped.
    let stopped = |stat: &str| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with(['T', 't', 'Z', 'X']))
    };
    loop {
        let Ok(dir) = std::fs::read_dir(&tasks) else {
            return Ok(());
        };
        let all = dir
            .filter_map(Result::ok)
            .all(|t| std::fs::read_to_string(t.path().join("stat")).map_or(true, |s| stopped(&s)));
        if all {
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid:?} did not stop within 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether a panic of a server's start says that a port found free was taken meanwhile (the
/// start can then be tried again on other ports).
pub(crate) fn lost_a_port(panic: &(dyn std::any::Any + Send)) -> bool {
    let text = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    text.contains("address already in use") || text.contains("Address already in use")
}

/// Polls `probe` every 20 ms until it gives `Ok`, for at most `within`. On time out, panics
/// saying what it waited for and what `probe` said last.
pub(crate) fn wait_for<T>(
    what: &str,
    within: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("waited {within:?} for {what}; last seen: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
