//! `run` when the store is slow, missing or cut off (issue 31): a lease is only as long as the
//! last renewal the store confirmed, the lease switch's margins come from the lease the store
//! really keeps, a wait rides out a store that is not up yet, and the exit never waits long for
//! a store that does not answer.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::postgres::PostgresServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::{alive, command_pid, kill, spawn, wait_exit, xtr};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A short ttl on a store that counts whole seconds and takes a lock up to 1 s early (its lease
/// is the ttl less 1 s): renewed in time, never taken for a loss. Before the fix the switch's
/// margins came from `--ttl` and stopped the command (exit 3) in every try.
#[test]
fn a_short_ttl_on_a_whole_second_store_is_not_taken_for_a_loss() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!(
        "sqlite://{}?create_table=true",
        dir.path().join("locks.db").display()
    );
    let memcached = MemcachedServer::start();
    for (store, ttl) in [
        (sqlite.as_str(), "3s"),
        (sqlite.as_str(), "2s"),
        (&memcached.url(), "2s"),
        (&memcached.url(), "3s"),
    ] {
        let out = xtr()
            .args(["run", "--json", "--store", store, "--ttl", ttl, "r"])
            .args(["--", "sleep", "2.5"])
            .timeout(Duration::from_secs(30))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{store} with --ttl {ttl}: renewed in time, not lost: {stderr}"
        );
        assert!(!stderr.contains("\"lost\""), "{stderr}");
    }
}

/// `-w` rides out a store that cannot be reached at the first attempt (a server starting), as
/// the library's wait does: before the fix the first try's error ended the run at once.
#[test]
fn a_wait_rides_out_a_server_that_is_not_up_yet() {
    let port = free_port();
    let starter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        RedisServer::start_on(port)
    });
    let started = Instant::now();
    let out = xtr()
        .args(["run", "-w", "20s", "--store"])
        .arg(format!("redis://127.0.0.1:{port}/0"))
        .args(["r", "--", "true"])
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    let _server = starter.join().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() >= Duration::from_millis(1400));
    // And a store that stays away: the wait ends at its deadline, saying why.
    let started = Instant::now();
    let out = xtr()
        .args(["run", "-w", "1500ms", "--store"])
        .arg(format!("redis://127.0.0.1:{}/0", free_port()))
        .args(["r", "--", "true"])
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(started.elapsed() >= Duration::from_millis(1400));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot reach the Redis server"), "{stderr}");
}

/// A quorum with two of three members down at the start, brought up during the wait.
#[test]
fn a_wait_rides_out_a_quorum_short_of_members() {
    let up = RedisServer::start();
    let ports = [free_port(), free_port()];
    let starter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        ports.map(RedisServer::start_on)
    });
    let out = xtr()
        .args(["run", "-w", "20s", "--store", &up.url(0)])
        .args(["--store", &format!("redis://127.0.0.1:{}/0", ports[0])])
        .args(["--store", &format!("redis://127.0.0.1:{}/0", ports[1])])
        .args(["r", "--", "true"])
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    let _servers = starter.join().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A quorum member paused: `run` exits once the majority confirmed the release (and a short
/// bound), not after the paused member's timeouts (20 s here; before the fix the exit waited them
/// out).
#[test]
fn a_paused_quorum_member_does_not_hold_up_the_exit() {
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    servers[2].pause();
    let mut cmd = xtr();
    cmd.arg("run");
    for s in &servers {
        cmd.args([
            "--store",
            &format!("{}?socket_timeout=20&socket_connect_timeout=20", s.url(0)),
        ]);
    }
    let started = Instant::now();
    let out = cmd
        .args(["-w", "3s", "free", "--", "true"])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    let took = started.elapsed();
    servers[2].resume();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        took < Duration::from_secs(10),
        "the exit waited {took:?} for the paused member"
    );
}

/// The table store on PostgreSQL, the holder cut off from the server (its connections frozen by
/// a proxy, the server still up for everyone else): the next holder gets the lock when the row
/// expires, and the first holder's command, which ignores SIGTERM, must be dead by then. Before
/// the fix an in-flight renewal counted as confirmed and the command ran beside the next
/// holder's for 1–2 s; and `xtr-lock` then did not exit until the database answered again.
#[test]
fn a_cut_off_holders_command_is_dead_before_the_next_holder_starts() {
    cut_off_holder_is_dead_before_the_next(|pidfile, ticks| {
        format!(
            "trap '' TERM; echo $$ > {}; while :; do date +%s%N >> {}; sleep 0.02; done",
            pidfile.display(),
            ticks.display()
        )
    });
}

/// Review finding: the same, with a command that stops on SIGTERM and leaves a child that
/// ignores it: the child ran on past the lease (the supervisor ended as soon as the command
/// did), beside the next holder's command.
#[test]
fn a_cut_off_holders_leftover_is_dead_before_the_next_holder_starts() {
    cut_off_holder_is_dead_before_the_next(|pidfile, ticks| {
        format!(
            "( trap '' TERM; echo $$ > /dev/null; while :; do date +%s%N >> {ticks}; \
             sleep 0.02; done ) & echo $! > {pid}; trap 'exit 143' TERM; \
             while :; do sleep 0.05; done",
            pid = pidfile.display(),
            ticks = ticks.display()
        )
    });
}

/// A holder on PostgreSQL running `script(pidfile, ticks)` (which writes the pid of what
/// ticks, then ticks), cut off from the server: what ticks is dead before the next holder's
/// command starts, and the holder exits 3.
fn cut_off_holder_is_dead_before_the_next(script: impl Fn(&Path, &Path) -> String) {
    let server = PostgresServer::start();
    let direct = format!("{}?create_table=true", server.url());
    // Make the table first, directly.
    xtr()
        .args(["run", "-n", "--store", &direct, "warm", "--", "true"])
        .timeout(Duration::from_secs(30))
        .assert()
        .code(0);
    let frozen = Arc::new(AtomicBool::new(false));
    let gate = frozen.clone();
    let port = xtr_lock_testkit::hook_proxy::start(server.port(), move |_, _| {
        while gate.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let proxied = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let dir = tempfile::tempdir().unwrap();
    let (pidfile, ticks, b_started) = (
        dir.path().join("a.pid"),
        dir.path().join("a.ticks"),
        dir.path().join("b.started"),
    );
    let script = script(&pidfile, &ticks);
    let mut a = spawn(&[
        "run", "--store", &proxied, "--ttl", "6s", "r", "--", "sh", "-c", &script,
    ]);
    let a_command = command_pid(&pidfile);
    std::thread::sleep(Duration::from_millis(500));
    frozen.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    let b_script = format!("date +%s%N > {}", b_started.display());
    let b = xtr()
        .args([
            "run", "-w", "30s", "--store", &direct, "r", "--", "sh", "-c",
        ])
        .arg(&b_script)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(
        b.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&b.stderr)
    );
    let b_start: u128 = read_ns(&b_started);
    let last_tick = std::fs::read_to_string(&ticks)
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse::<u128>().ok())
        .max()
        .unwrap();
    assert!(
        last_tick < b_start,
        "A's command ticked {} ms after B's started",
        (last_tick - b_start) / 1_000_000
    );
    assert!(!alive(a_command), "A's command outlived its lease");
    // A knows it lost the lock and exits without waiting for the database to answer again.
    let status = wait_exit(&mut a, "A still running 20 s after B got the lock");
    assert_eq!(status.code(), Some(3));
    assert!(cut_at.elapsed() < Duration::from_secs(40));
    frozen.store(false, Ordering::SeqCst);
    kill(a_command, rustix::process::Signal::KILL);
}

fn read_ns(path: &Path) -> u128 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Interrupted during `-w` while the store does not answer: the clean-up release is bounded
/// like every exit's (2 s), not by the store's 20 s socket timeout.
#[test]
fn an_interrupted_wait_on_a_paused_store_exits_within_the_bound() {
    let server = RedisServer::start();
    let url = format!("{}?socket_timeout=20", server.url(0));
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("holder.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut holder = spawn(&["run", "--store", &url, "held", "--", "sh", "-c", &script]);
    command_pid(&pidfile);
    let clients = || server.cli(&["CLIENT", "LIST"]).lines().count();
    let before = clients();
    let mut waiter = spawn(&["run", "-w", "60s", "--store", &url, "held", "--", "true"]);
    // The waiter is connected, so past its start (its signal handlers are set first).
    let connected = Instant::now();
    while clients() <= before {
        assert!(
            connected.elapsed() < Duration::from_secs(10),
            "the waiter never connected"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    server.pause();
    // A poll of the wait is now in flight, unanswered.
    std::thread::sleep(Duration::from_millis(300));
    let interrupted = Instant::now();
    kill(waiter.id() as i32, rustix::process::Signal::INT);
    let status = wait_exit(&mut waiter, "the interrupted waiter");
    let took = interrupted.elapsed();
    server.resume();
    kill(holder.id() as i32, rustix::process::Signal::TERM);
    let _ = wait_exit(&mut holder, "the holder");
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(
        took < Duration::from_secs(6),
        "the interrupted wait exited {took:?} after SIGINT"
    );
}
