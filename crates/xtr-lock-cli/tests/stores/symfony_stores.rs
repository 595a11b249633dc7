//! `xtr-lock` on Symfony's remaining stores: SysV semaphores (`semaphore`), where a killed
//! `xtr-lock` frees the lock at once and stops its command, and Memcached, where a lock deleted
//! behind the holder's back stops the command (exit 3), and `-s`, which takes the exclusive lock
//! there, says so.

use std::time::{Duration, Instant};

use rustix::process::Signal;
use xtr_lock_testkit::memcached::MemcachedServer;

use crate::common::{kill, run_holding, wait_exit, wait_gone, xtr};

fn unique(what: &str) -> String {
    format!("cli-sem:{what}:{}", std::process::id())
}

#[test]
fn semaphore_run_status_and_a_killed_xtr_lock_frees_the_lock_at_once() {
    let resource = unique("job");
    let tmp = tempfile::tempdir().unwrap();
    let (run, command) = run_holding(
        &["run", "--store", "semaphore", &resource],
        &tmp.path().join("pid"),
    );
    let out = xtr()
        .args(["status", "--store", "semaphore", &resource])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("held by pid {} (write)", run.id())),
        "{text}"
    );
    assert!(text.contains("SysV semaphore key 0x"), "{text}");
    let busy = xtr()
        .args(["run", "-n", "--store", "semaphore", &resource, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(busy.status.code(), Some(1));

    // SIGKILL: the kernel gives the semaphore back (SEM_UNDO), and the command, which no
    // longer runs under a lock, is stopped.
    kill(run.id() as i32, Signal::KILL);
    wait_gone(command, "the command of a killed xtr-lock");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = xtr()
            .args(["run", "-n", "--store", "semaphore", &resource, "--", "true"])
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "the lock stayed held");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn memcached_run_status_and_a_deleted_entry_stops_the_command() {
    let server = MemcachedServer::start();
    let dsn = server.url();
    let tmp = tempfile::tempdir().unwrap();
    let (mut run, command) = run_holding(
        &["run", "--store", &dsn, "--ttl", "3", "job"],
        &tmp.path().join("pid"),
    );
    let out = xtr()
        .args(["status", "--store", &dsn, "job"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("held by holder ") && text.contains("(write, "),
        "{text}"
    );
    assert!(
        server.get("job").is_some_and(|t| t.len() == 44),
        "Symfony's layout: the resource's key holds a 44-character token"
    );
    // An operator deletes the entry: the next renewal finds it gone.
    assert!(server.command("md job").unwrap().starts_with("HD"));
    let status = wait_exit(&mut run, "run did not notice the lost lock");
    assert_eq!(status.code(), Some(3));
    wait_gone(command, "the command of a lost lock");
}

/// Memcached has no shared locks: `-s` says it takes the exclusive lock. Its locks expire, so
/// `--ttl` is used and nothing is said of it; `--ttl none` is refused before anything is stored.
#[test]
fn memcached_says_that_s_is_exclusive_and_uses_the_ttl() {
    let server = MemcachedServer::start();
    let dsn = server.url();
    let run = |args: &[&str]| {
        let out = xtr()
            .args(["run", "--store", &dsn])
            .args(args)
            .args(["warned", "--", "true"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(
        run(&["-s", "--ttl", "30s"]),
        (
            Some(0),
            "xtr-lock: warning: the memcached store has no shared locks; -s takes an exclusive \
             lock\n"
                .to_owned()
        )
    );
    assert_eq!(run(&["--ttl", "30s"]), (Some(0), String::new()));
    assert_eq!(run(&["-q", "-s"]), (Some(0), String::new()));
    let (code, stderr) = run(&["--ttl", "none"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("the memcached store's locks expire"),
        "{stderr}"
    );
    assert!(server.get("warned").is_none(), "nothing was stored");
}
