//! `xtr-lock` on etcd: the queue in `status`, a revoked lease stops the command (exit 3), a
//! SIGKILLed holder's lock goes when its lease ends and not before, a stopped `xtr-lock`
//! has its command stopped before the lease it can no longer keep alive ends, `-w` rides out a
//! paused server, and runs leave no lease behind.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use rustix::process::Signal;
use xtr_lock_testkit::etcd::EtcdCluster;

use crate::common;
use crate::common::{alive, kill, spawn, wait_gone, xtr};

/// `xtr-lock run` with `--ttl ttl` on `resource`, its command writing its pid and sleeping.
fn run_holding(cluster: &EtcdCluster, resource: &str, ttl: &str, tmp: &Path) -> (Child, i32) {
    common::run_holding(
        &["run", "--store", &cluster.dsn(""), "--ttl", ttl, resource],
        &tmp.join(format!("{resource}.pid")),
    )
}

/// `xtr-lock run -w 20s RESOURCE -- true` succeeds: the lock was free, or became free in time.
fn takes_within_20s(cluster: &EtcdCluster, resource: &str) {
    let out = xtr()
        .args([
            "run",
            "--store",
            &cluster.dsn(""),
            "--wait",
            "20s",
            resource,
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `status` says `resource` is held.
fn held(cluster: &EtcdCluster, resource: &str) -> bool {
    let out = xtr()
        .args(["status", "--store", &cluster.dsn(""), resource])
        .output()
        .unwrap();
    out.status.code() == Some(0)
}

#[test]
fn status_shows_the_holder_and_the_queue() {
    let cluster = EtcdCluster::single();
    let tmp = tempfile::tempdir().unwrap();
    let store = cluster.dsn("");
    xtr()
        .args(["status", "--store", &store, "q"])
        .assert()
        .code(1);
    let (run, _) = run_holding(&cluster, "q", "60s", tmp.path());
    let mut waiter = spawn(&["run", "--store", &store, "q", "--", "true"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let out = xtr()
            .args(["status", "--store", &store, "q"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("queue:") {
            assert_eq!(out.status.code(), Some(0));
            break text;
        }
        assert!(Instant::now() < deadline, "no queue in {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(text.contains("\"q\": held by lease "), "{text}");
    assert!(text.contains("(write, "), "{text}");
    assert!(text.contains("waiting"), "{text}");
    assert!(text.contains("(etcdctl lock \"q\")"), "{text}");
    kill(run.id() as i32, Signal::TERM);
    assert!(waiter.wait().unwrap().success());
    common::stop(run);
}

#[test]
fn a_revoked_lease_stops_the_command_and_exits_3() {
    let cluster = EtcdCluster::single();
    let tmp = tempfile::tempdir().unwrap();
    let (run, pid) = run_holding(&cluster, "revoked", "60s", tmp.path());
    let leases = cluster.etcdctl_output(&["lease", "list"]);
    let lease = leases
        .lines()
        .find_map(|l| l.trim().strip_prefix("id:"))
        .or_else(|| leases.lines().nth(1))
        .unwrap()
        .trim()
        .to_owned();
    cluster.etcdctl_output(&["lease", "revoke", &lease]);
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    wait_gone(pid, "the command of a lost lock");
}

#[test]
fn a_sigkilled_holder_is_released_when_its_lease_ends_not_before() {
    let cluster = EtcdCluster::single();
    let tmp = tempfile::tempdir().unwrap();
    let (mut run, pid) = run_holding(&cluster, "crash", "3s", tmp.path());
    let killed = Instant::now();
    kill(run.id() as i32, Signal::KILL);
    run.wait().unwrap();
    wait_gone(pid, "the command of a killed xtr-lock");
    // The lease was kept alive at most a third of its ttl ago: it lasts two thirds more.
    std::thread::sleep(Duration::from_millis(1200));
    assert!(held(&cluster, "crash"), "released before its lease ended");
    takes_within_20s(&cluster, "crash");
    let after = killed.elapsed();
    assert!(after >= Duration::from_secs(2), "{after:?}");
}

#[test]
fn a_stopped_xtr_lock_has_its_command_stopped_before_its_lease_ends() {
    let cluster = EtcdCluster::single();
    let tmp = tempfile::tempdir().unwrap();
    let (run, pid) = run_holding(&cluster, "stopped", "2s", tmp.path());
    let xtr_pid = run.id() as i32;
    kill(xtr_pid, Signal::STOP);
    // The supervisor stops the command before the lease can end...
    wait_gone(pid, "the command of a stopped xtr-lock");
    assert!(!alive(pid));
    // ...then the lease ends and someone else takes the lock.
    takes_within_20s(&cluster, "stopped");
    kill(xtr_pid, Signal::CONT);
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
}

/// `run -w 60s` waiting while the only member is stopped for 6 s (longer than the 3 s leases):
/// the waiter waits on and runs its command once the holder's lease is gone; the holder, whose
/// lease could have ended, has its command stopped and exits 3.
#[test]
fn a_waiter_rides_out_a_paused_server() {
    let cluster = EtcdCluster::single();
    let tmp = tempfile::tempdir().unwrap();
    let (holder, pid) = run_holding(&cluster, "paused", "3s", tmp.path());
    let store = cluster.dsn("");
    let waiter = spawn(&[
        "run", "--store", &store, "-w", "60s", "--ttl", "3s", "paused", "--", "true",
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster
        .etcdctl_output(&["get", "--prefix", "--keys-only", "paused/"])
        .lines()
        .filter(|l| !l.is_empty())
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "the waiter queues");
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.pause(0);
    std::thread::sleep(Duration::from_secs(6));
    cluster.resume(0);
    let out = waiter.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the waiter gave up: {stderr}");
    wait_gone(
        pid,
        "the command of the holder whose lease could have ended",
    );
    let out = holder.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Three plain runs, one of them waiting for another: no lease is left when they are done
/// (each run revokes its lease before it exits).
#[test]
fn runs_leave_no_lease_behind() {
    let cluster = EtcdCluster::single();
    let store = cluster.dsn("");
    let first = spawn(&["run", "--store", &store, "leak", "--", "sleep", "1"]);
    let second = spawn(&["run", "--store", &store, "-w", "20s", "leak", "--", "true"]);
    for run in [first, second] {
        let out = run.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    xtr()
        .args(["run", "--store", &store, "leak", "--", "true"])
        .assert()
        .success();
    let leases = cluster.etcdctl_output(&["lease", "list"]);
    assert_eq!(leases.trim(), "found 0 leases", "{leases}");
}
