//! `xtr-lock run -n` whose save is held back by a proxy past the store's request timeout: the
//! run fails (exit 2), then the late save lands. The command must not exit before its clean-up
//! of that save (issue 30): once the save has landed, nothing is left held, and another
//! `run -n` gets the lock. On Memcached (the add, `?timeout=0.5`) and Redis (the save,
//! `?socket_timeout=0.5`).

use std::time::Duration;

use xtr_lock_testkit::hook_proxy::HeldRequest;
use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::xtr;

/// How long the proxy holds the save back: past the request timeout (0.5 s), within the
/// landing bound of one more timeout and the exit's 2 s settle.
const HELD: Duration = Duration::from_millis(800);
/// A bound on anything expected to happen "at once" on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(10);

fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("cli-late-{what}-{}-{nanos:08x}", std::process::id())
}

/// The first chunk naming `resource`: the acquire's save (nothing before it names it).
fn names(resource: &str) -> impl Fn(usize, &[u8]) -> bool + Send + Sync + 'static {
    let name = resource.as_bytes().to_vec();
    move |_, chunk| {
        let hit = chunk.windows(name.len()).any(|w| w == name.as_slice());
        if hit {
            eprintln!("held: {}", String::from_utf8_lossy(chunk).escape_debug());
        }
        hit
    }
}

/// `run -n` through `proxied` fails with exit 2; once the held save landed, `run -n` through
/// `direct` gets the lock within the patience.
fn a_late_save_leaves_nothing_held(
    proxied: &str,
    direct: &str,
    resource: &str,
    held: &HeldRequest,
) {
    // A run on another resource first: Redis then knows the store's scripts, so the held
    // save (an EVALSHA) is not refused as NOSCRIPT when it lands.
    let warm = format!("{resource}-warm");
    xtr()
        .args(["run", "-n", "--store", direct, &warm, "--", "true"])
        .timeout(PATIENCE)
        .assert()
        .code(0);
    let out = xtr()
        .args([
            "run", "-n", "--ttl", "30s", "--store", proxied, resource, "--", "true",
        ])
        .timeout(HELD + PATIENCE)
        .output()
        .unwrap();
    assert!(held.arrived().is_some(), "the proxy saw the save");
    assert_eq!(
        out.status.code(),
        Some(2),
        "the save timed out: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let landed = held.wait_landed(HELD + PATIENCE);
    loop {
        let next = xtr()
            .args(["run", "-n", "--store", direct, resource, "--", "true"])
            .timeout(PATIENCE)
            .output()
            .unwrap();
        if next.status.code() == Some(0) {
            return;
        }
        let status = xtr()
            .args(["status", "--store", direct, resource])
            .output()
            .unwrap();
        assert!(
            landed.elapsed() < PATIENCE,
            "the late save landed and stayed: {:?} after it landed, `run -n` exits {:?} and \
             `status` says {:?}, though the run that saved it failed and exited",
            landed.elapsed(),
            next.status.code(),
            String::from_utf8_lossy(&status.stdout).trim()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn memcached_a_run_whose_add_lands_late_leaves_nothing_held() {
    let server = MemcachedServer::start();
    let resource = unique("memcached");
    let (port, held) = HeldRequest::start(server.port(), HELD, names(&resource));
    let proxied = format!("memcached://127.0.0.1:{port}?timeout=0.5");
    a_late_save_leaves_nothing_held(&proxied, &server.url(), &resource, &held);
}

#[test]
fn redis_a_run_whose_save_lands_late_leaves_nothing_held() {
    let server = RedisServer::start();
    let resource = unique("redis");
    let (port, held) = HeldRequest::start(server.port(), HELD, names(&resource));
    let proxied = format!("redis://127.0.0.1:{port}/0?socket_timeout=0.5");
    a_late_save_leaves_nothing_held(&proxied, &server.url(0), &resource, &held);
}

/// The exit waits for clean-ups 2 s at most, and says so with -v when that bound is hit: here
/// the add times out at 3 s and may land until 6 s (the landing bound of one more timeout),
/// so the run exits at 5 s before its clean-up could run, and says why the lock may stay held.
#[test]
fn a_run_that_exits_before_its_clean_up_says_so_with_v() {
    let server = MemcachedServer::start();
    let resource = unique("memcached-bound");
    let (port, held) = HeldRequest::start(server.port(), Duration::from_secs(8), names(&resource));
    let proxied = format!("memcached://127.0.0.1:{port}?timeout=3");
    let started = std::time::Instant::now();
    let out = xtr()
        .args([
            "run", "-n", "-v", "--ttl", "30s", "--store", &proxied, &resource, "--", "true",
        ])
        .timeout(PATIENCE)
        .output()
        .unwrap();
    assert!(held.arrived().is_some(), "the proxy saw the save");
    assert_eq!(out.status.code(), Some(2), "the save timed out");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("still running after 2s"),
        "the exit says it left clean-ups running: {stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "the exit did not wait for the request to land"
    );
}
