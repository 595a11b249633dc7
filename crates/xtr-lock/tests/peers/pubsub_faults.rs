//! The pub/sub store and portalocker 4.4.2 when something goes wrong: a holder killed, wedged
//! or paused in either language, poison payloads, a foreign subscriber, a blocked runtime, and a
//! mixed soak checked for overlaps.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::{Lockable as _, RedisPubSubStore};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::portalocker::{Py, SOON, channel, lock_on, now, python_probe, store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_python_holder_is_released_at_once_for_a_rust_waiter() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("kill9");
    let mut py = Py::start(&server, &["hold", &c, "exclusive"]);
    py.expect("ACQUIRED", SOON).await;
    let rust = lock_on(&store, &c);
    assert!(!rust.try_acquire().await.unwrap());
    let killed = Instant::now();
    py.signal(rustix::process::Signal::KILL);
    assert!(
        rust.acquire_timeout(SOON).await.unwrap(),
        "acquired in time"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "{:?}",
        killed.elapsed()
    );
    let _ = rust.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_python_holder_is_reaped_by_a_rust_waiter_and_told() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("wedged-py");
    let mut py = Py::start(&server, &["hold", &c, "exclusive", "--wedge"]);
    py.expect("ACQUIRED", SOON).await;
    let rust = lock_on(&store, &c);
    assert!(
        rust.acquire_timeout(SOON).await.unwrap(),
        "acquired in time"
    );
    py.expect("LOST", SOON).await;
    assert_eq!(py.exit_code().await, 3);
    let _ = rust.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_python_holder_is_taken_over_and_finds_out_on_resume() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("paused-py");
    let mut py = Py::start(&server, &["hold", &c, "exclusive"]);
    py.expect("ACQUIRED", SOON).await;
    py.signal(rustix::process::Signal::STOP);
    let rust = lock_on(&store, &c);
    assert!(
        rust.acquire_timeout(SOON).await.unwrap(),
        "acquired in time"
    );
    py.signal(rustix::process::Signal::CONT);
    py.expect("LOST", SOON).await;
    let _ = rust.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_rust_holder_is_reaped_by_python_and_told_without_resubscribing() {
    let server = RedisServer::start();
    // A lease of its own (27 s) far beyond the test: the loss it is told of is Python's reap,
    // not its own self-checks running out.
    let store = RedisPubSubStore::from_dsn(&format!(
        "redis+pubsub://127.0.0.1:{}/0?unavailable_timeout=30",
        server.port()
    ))
    .unwrap();
    let c = channel("wedged-rust");
    let rust = lock_on(&store, &c);
    assert!(rust.try_acquire().await.unwrap());
    let name = store.connection_name(rust.key()).unwrap();
    assert!(
        server
            .cli(&["CLIENT", "LIST"])
            .contains(&format!("name={name} "))
    );
    let keep_alive = rust.keep_alive().unwrap();
    store.stop_answering(rust.key());
    let mut py = Py::start(&server, &["hold", &c, "exclusive"]);
    py.expect("ACQUIRED", SOON).await;
    let lost = tokio::time::timeout(SOON, keep_alive.lost())
        .await
        .expect("told");
    assert!(lost.to_string().contains("connection"), "{lost}");
    assert!(!rust.is_acquired().await.unwrap());
    assert!(
        !server.cli(&["CLIENT", "LIST"]).contains(&name),
        "not resubscribed"
    );
    assert_eq!(
        server.cli(&["PUBSUB", "NUMSUB", &c]).lines().nth(1),
        Some("1")
    );
    py.release();
    py.expect("RELEASED", SOON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_does_not_cost_a_rust_holder_its_lock() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("poison");
    let rust = lock_on(&store, &c);
    assert!(rust.try_acquire().await.unwrap());
    let mut cli = Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "-x", "PUBLISH", &c])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    cli.stdin.take().unwrap().write_all(b"\xff\xfe").unwrap();
    cli.wait().unwrap();
    for garbage in ["not json", "{\"response_channel\": 5}", "[]", ""] {
        server.cli(&["PUBLISH", &c, garbage]);
    }
    // The holder reads its pushes in order: answering this probe means it has read every
    // payload above, and kept its lock through them.
    let records = python_probe(&server, &c).await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["mode"], "exclusive");
    assert!(rust.is_acquired().await.unwrap());
    let _ = rust.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_subscriber_is_named_in_the_error_and_never_killed() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("foreign");
    let mut sub = Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "SUBSCRIBE", &c])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + SOON;
    while server.cli(&["PUBSUB", "NUMSUB", &c]).lines().nth(1) != Some("1") {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rust = lock_on(&store, &c);
    let started = Instant::now();
    let err = rust
        .acquire_timeout(Duration::from_secs(3))
        .await
        .unwrap_err();
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    assert!(text.contains("are not lock holders"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Our own subscription goes (unsubscribing is asynchronous, so it may linger a moment);
    // the foreign one stays, its process alive.
    let deadline = Instant::now() + SOON;
    let mut left = server.cli(&["PUBSUB", "NUMSUB", &c]);
    while left.lines().nth(1) != Some("1") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        left = server.cli(&["PUBSUB", "NUMSUB", &c]);
    }
    assert_eq!(
        left.lines().nth(1),
        Some("1"),
        "the foreign subscriber is still there, and only it"
    );
    assert!(sub.try_wait().unwrap().is_none(), "never killed");
    assert!(!rust.is_acquired().await.unwrap());
    sub.kill().unwrap();
    sub.wait().unwrap();
}

/// Two exclusive and two shared loops in each language on one channel: no interval of a writer
/// overlaps any other interval.
/// A hold in the mixed soak: when it started and ended (seconds on the shared clock), whether
/// it was a writer's, and whose it was (`rust-0`, `py-2`).
type Interval = (f64, f64, bool, String);

/// Four portalocker loops on `c`, two writers and two readers, six holds each.
fn soak_pythons(server: &RedisServer, c: &str) -> Vec<Py> {
    let iterations = "6";
    ["exclusive", "exclusive", "shared", "shared"]
        .iter()
        .map(|mode| {
            Py::start(
                server,
                &[
                    "loop",
                    c,
                    mode,
                    iterations,
                    "--check-interval",
                    "0.02",
                    "--hold",
                    "0.03",
                    "--timeout",
                    "60",
                ],
            )
        })
        .collect()
}

/// One Rust side of the soak: six holds of 30 ms, recorded in `intervals`, their waits in `waits`.
async fn rust_soaker(
    store: RedisPubSubStore,
    c: String,
    who: String,
    write: bool,
    intervals: Arc<std::sync::Mutex<Vec<Interval>>>,
    waits: Arc<std::sync::Mutex<Vec<Duration>>>,
) {
    for _ in 0..6 {
        let lock = lock_on(&store, &c);
        let asked = Instant::now();
        if write {
            assert!(
                lock.acquire_timeout(Duration::from_secs(90)).await.unwrap(),
                "acquired in time"
            );
        } else {
            assert!(
                lock.acquire_read_timeout(Duration::from_secs(90))
                    .await
                    .unwrap(),
                "acquired in time"
            );
        }
        let start = now();
        waits.lock().unwrap().push(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(30)).await;
        let end = now();
        intervals
            .lock()
            .unwrap()
            .push((start, end, write, who.clone()));
        let _ = lock.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The holds the Python loops report, once each has done its six without a failure or a loss.
async fn python_intervals(pythons: &mut [Py]) -> Vec<Interval> {
    let mut all = Vec::new();
    for (n, py) in pythons.iter_mut().enumerate() {
        let lines = py.rest().await;
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("DONE acquired=6 failed=0")),
            "{lines:?}"
        );
        let mut open: Option<(f64, bool)> = None;
        for line in lines {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts[0] {
                "ACQUIRED" => open = Some((parts[1].parse().unwrap(), parts[2] == "exclusive")),
                "RELEASED" => {
                    let (start, write) = open.take().unwrap();
                    all.push((start, parts[1].parse().unwrap(), write, format!("py-{n}")));
                }
                "LOST" => panic!("a Python holder lost its lock: {line}"),
                _ => {}
            }
        }
    }
    all
}

/// The pairs of holds that overlap where either side writes.
fn overlaps(all: &[Interval]) -> Vec<(Interval, Interval)> {
    let mut violations = Vec::new();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if (a.2 || b.2) && a.0 < b.1 && b.0 < a.1 {
                violations.push((a.clone(), b.clone()));
            }
        }
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_soak_has_no_overlap_where_either_side_writes() {
    let server = RedisServer::start();
    // Python's loops try every 0.02 s plus their own teardown (up to 0.11 s): ours try as often.
    let store = RedisPubSubStore::from_dsn(&format!(
        "redis+pubsub://127.0.0.1:{}/0?check_interval=0.1",
        server.port()
    ))
    .unwrap();
    let c = channel("soak");
    let mut pythons = soak_pythons(&server, &c);
    let intervals = Arc::new(std::sync::Mutex::new(Vec::<Interval>::new()));
    let waits = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let mut rust = Vec::new();
    for (i, write) in [true, true, false, false].into_iter().enumerate() {
        rust.push(tokio::spawn(rust_soaker(
            store.clone(),
            c.clone(),
            format!("rust-{i}"),
            write,
            intervals.clone(),
            waits.clone(),
        )));
    }
    for task in rust {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .unwrap()
            .unwrap();
    }
    let mut all = intervals.lock().unwrap().clone();
    all.extend(python_intervals(&mut pythons).await);
    assert_eq!(all.len(), 48);
    let violations = overlaps(&all);
    assert!(violations.is_empty(), "overlaps: {violations:?}");
    let mut waits = waits.lock().unwrap().clone();
    waits.sort();
    eprintln!(
        "Rust waits: median {:?}, max {:?}",
        waits[waits.len() / 2],
        waits.last().unwrap()
    );
}

/// A holder whose code blocks its own runtime (one thread, a long non-yielding call) still
/// answers pings: a Python contender sees it hold instead of reaping it, as it would reap a
/// Python holder stuck the same way.
#[test]
fn a_holder_whose_runtime_is_blocked_still_answers_and_is_not_reaped() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("busy");
    let rust = lock_on(&store, &c);
    assert!(runtime.block_on(rust.try_acquire()).unwrap());
    let port = server.port();
    let contender = {
        let c = c.clone();
        std::thread::spawn(move || {
            let python = xtr_lock_testkit::python::python_with_peers();
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/pubsub_peer.py");
            let out = Command::new(python)
                .arg(script)
                .args([
                    &port.to_string(),
                    "try",
                    &c,
                    "exclusive",
                    "--unavailable-timeout",
                    "0.5",
                ])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    };
    // The user's code hogs the only thread of its runtime while the contender probes.
    let started = Instant::now();
    while !contender.is_finished() && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let said = contender.join().unwrap();
    assert!(
        said.starts_with("NOT_ACQUIRED"),
        "Python saw the lock held: {said:?}"
    );
    assert!(runtime.block_on(rust.is_acquired()).unwrap(), "not reaped");
    let _ = runtime.block_on(rust.release()).unwrap();
}
