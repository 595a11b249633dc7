//! The pub/sub store against real portalocker 4.4.2 processes on one throwaway Redis: both
//! directions of every exchange, the wire format byte for byte, crashes, reaping, a mixed soak.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;
use xtr_lock::{Lock, LockFactory, Lockable as _, RedisPubSubStore, Store as _};
use xtr_lock_testkit::redis::RedisServer;

/// A generous bound for what should take well under a second.
const SOON: Duration = Duration::from_secs(10);

/// portalocker's script (`tests/py/pubsub_peer.py`), one process per call.
struct Py {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Py {
    fn start(server: &RedisServer, args: &[&str]) -> Py {
        let python = xtr_lock_testkit::python::python_with_peers();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/pubsub_peer.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(server.port().to_string())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python with portalocker");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Py {
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next line starting with `prefix` (others are kept in `seen`).
    async fn expect(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Ok(None) => panic!("the peer ended before {prefix:?}; it said {:?}", self.seen),
                Err(_) => panic!(
                    "no {prefix:?} within {within:?}; the peer said {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Every line until the process ends.
    async fn rest(&mut self) -> Vec<String> {
        while let Ok(Some(line)) = tokio::time::timeout(SOON * 6, self.lines.recv()).await {
            self.seen.push(line);
        }
        self.seen.clone()
    }

    fn release(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"\n");
            let _ = stdin.flush();
        }
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    async fn exit_code(mut self) -> i32 {
        tokio::task::spawn_blocking(move || self.child.wait().unwrap().code().unwrap_or(-1))
            .await
            .unwrap()
    }
}

fn store(server: &RedisServer) -> RedisPubSubStore {
    RedisPubSubStore::from_dsn(&format!("redis+pubsub://127.0.0.1:{}/0", server.port())).unwrap()
}

fn channel(name: &str) -> String {
    format!("{name}-{}", rand_suffix())
}

fn rand_suffix() -> String {
    let n = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{n:08x}")
}

fn lock_on(store: &RedisPubSubStore, resource: &str) -> Lock {
    LockFactory::new(store.clone()).create_lock(resource)
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Python's read-only probe: the JSON records it parsed.
async fn python_probe(server: &RedisServer, channel: &str) -> Vec<serde_json::Value> {
    let mut py = Py::start(server, &["probe", channel, "2"]);
    let lines = py.rest().await;
    assert!(
        lines.iter().any(|l| l.starts_with("PROBE_DONE")),
        "the probe was conclusive: {lines:?}"
    );
    lines
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_against_exclusive_both_ways() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("excl");
    // Python holds: a Rust try fails, a blocking acquire gets it after the release.
    let mut py = Py::start(&server, &["hold", &c, "exclusive"]);
    py.expect("ACQUIRED", SOON).await;
    let rust = lock_on(&store, &c);
    assert!(!rust.try_acquire().await.unwrap(), "Python holds");
    py.release();
    let released = py.expect("RELEASED", SOON).await;
    assert!(
        rust.acquire_timeout(SOON).await.unwrap(),
        "acquired in time"
    );
    assert!(rust.is_acquired().await.unwrap());
    let t: f64 = released.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(now() >= t);
    // Rust holds: a Python try fails, a Python holder gets it after our release.
    let mut attempt = Py::start(&server, &["try", &c, "exclusive"]);
    attempt.expect("NOT_ACQUIRED", SOON).await;
    assert_eq!(attempt.exit_code().await, 1);
    let mut py = Py::start(
        &server,
        &["hold", &c, "exclusive", "--check-interval", "0.02"],
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    rust.release().await.unwrap();
    py.expect("ACQUIRED", SOON).await;
    assert!(!rust.try_acquire().await.unwrap(), "Python holds now");
    py.release();
    py.expect("RELEASED", SOON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_across_languages_and_python_parses_ours() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("shared");
    let mut py = Py::start(&server, &["hold", &c, "shared"]);
    py.expect("ACQUIRED", SOON).await;
    let rust = lock_on(&store, &c);
    assert!(rust.try_acquire_read().await.unwrap(), "readers share");
    let records = python_probe(&server, &c).await;
    assert_eq!(records.len(), 2, "{records:?}");
    for r in &records {
        assert_eq!(r["mode"], "shared", "{r}");
        assert_eq!(r["elected"], false, "{r}");
        assert_eq!(r["legacy"], false, "{r}");
    }
    let ours = rust.key().holder_id("pubsub").unwrap();
    assert!(
        records
            .iter()
            .any(|r| r["holder_id"].as_str().unwrap().starts_with(&ours)),
        "our id {ours} is among {records:?}"
    );
    // And we see the Python reader.
    let holders = store.holders(&c).await.unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    rust.release().await.unwrap();
    py.release();
    py.expect("RELEASED", SOON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_writer_waits_on_a_python_reader_elected_and_blocking_new_readers() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("w-on-r");
    let mut reader = Py::start(&server, &["hold", &c, "shared"]);
    reader.expect("ACQUIRED", SOON).await;
    let writer = lock_on(&store, &c);
    let waiting = {
        let writer = writer.clone();
        tokio::spawn(async move { writer.acquire_timeout(SOON * 3).await })
    };
    // Elected behind the reader, still subscribed, answering: Python sees pending/true.
    let deadline = Instant::now() + SOON;
    loop {
        let records = python_probe(&server, &c).await;
        if records
            .iter()
            .any(|r| r["mode"] == "pending" && r["elected"] == true)
        {
            break;
        }
        assert!(Instant::now() < deadline, "never elected: {records:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut late = Py::start(&server, &["try", &c, "shared"]);
    late.expect("NOT_ACQUIRED", SOON).await;
    reader.release();
    reader.expect("RELEASED", SOON).await;
    assert!(waiting.await.unwrap().unwrap(), "acquired in time");
    assert!(writer.is_acquired().await.unwrap());
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_writer_waits_on_a_rust_reader_and_our_reader_then_waits() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("r-then-w");
    let reader = lock_on(&store, &c);
    assert!(reader.try_acquire_read().await.unwrap());
    let mut writer = Py::start(
        &server,
        &["hold", &c, "exclusive", "--check-interval", "0.02"],
    );
    // Once the Python writer is elected, a new Rust reader is refused.
    let second = lock_on(&store, &c);
    let deadline = Instant::now() + SOON;
    while second.try_acquire_read().await.unwrap() {
        second.release().await.unwrap();
        assert!(
            Instant::now() < deadline,
            "the Python writer never blocked readers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reader.release().await.unwrap();
    writer.expect("ACQUIRED", SOON).await;
    assert!(!second.try_acquire_read().await.unwrap(), "Python writes");
    writer.release();
    writer.expect("RELEASED", SOON).await;
    assert!(
        second.acquire_read_timeout(SOON).await.unwrap(),
        "acquired in time"
    );
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elected_python_writer_is_deferred_to_by_a_lower_rust_id() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("defer");
    let reader = lock_on(&store, &c);
    assert!(reader.try_acquire_read().await.unwrap());
    let high = "f".repeat(32);
    let mut py = Py::start(
        &server,
        &[
            "hold",
            &c,
            "exclusive",
            "--holder-id",
            &high,
            "--check-interval",
            "0.02",
        ],
    );
    // The Python writer is elected behind our reader.
    let deadline = Instant::now() + SOON;
    loop {
        let records = python_probe(&server, &c).await;
        if records
            .iter()
            .any(|r| r["holder_id"] == high.as_str() && r["elected"] == true)
        {
            break;
        }
        assert!(Instant::now() < deadline, "never elected: {records:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A Rust writer with a lower id (every id is below f…f) defers to the incumbent.
    let writer = lock_on(&store, &c);
    let rust_got_it = Arc::new(std::sync::Mutex::new(None::<f64>));
    let waiting = {
        let (writer, got) = (writer.clone(), rust_got_it.clone());
        tokio::spawn(async move {
            assert!(
                writer.acquire_timeout(SOON * 3).await.unwrap(),
                "acquired in time"
            );
            *got.lock().unwrap() = Some(now());
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    reader.release().await.unwrap();
    let acquired = py.expect("ACQUIRED", SOON).await;
    assert!(rust_got_it.lock().unwrap().is_none(), "Python first");
    py.release();
    let released: f64 = py
        .expect("RELEASING", SOON)
        .await
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    waiting.await.unwrap();
    let ours = rust_got_it.lock().unwrap().unwrap();
    let py_at: f64 = acquired.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(ours > py_at, "Rust after Python");
    assert!(ours >= released, "Rust after Python began to release");
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_replies_are_pythons_byte_for_byte_in_every_state() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("wire");
    let replies = |lines: Vec<String>| -> Vec<String> {
        lines
            .into_iter()
            .filter_map(|l| l.strip_prefix("REPLY ").map(str::to_owned))
            .collect()
    };
    let id_re = |reply: &str, mode: &str, elected: bool| {
        let prefix = "{\"holder_id\": \"";
        assert!(reply.starts_with(prefix), "{reply}");
        let id = &reply[prefix.len()..prefix.len() + 32];
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{reply}"
        );
        assert_eq!(
            reply,
            format!(
                "{{\"holder_id\": \"{id}\", \"mode\": \"{mode}\", \"protocol\": 1, \"elected\": {elected}}}"
            )
        );
    };
    // Shared.
    let reader = lock_on(&store, &c);
    assert!(reader.try_acquire_read().await.unwrap());
    let r = replies(Py::start(&server, &["ping", &c, "0.5"]).rest().await);
    assert_eq!(r.len(), 1, "{r:?}");
    id_re(&r[0], "shared", false);
    // Pending and elected, behind our reader; then exclusive.
    let writer = lock_on(&store, &c);
    let waiting = {
        let writer = writer.clone();
        tokio::spawn(async move { writer.acquire_timeout(SOON * 3).await })
    };
    let deadline = Instant::now() + SOON;
    loop {
        let r = replies(Py::start(&server, &["ping", &c, "0.3"]).rest().await);
        if r.iter()
            .any(|x| x.contains("\"pending\"") && x.ends_with("true}"))
        {
            let pending = r.iter().find(|x| x.contains("\"pending\"")).unwrap();
            id_re(pending, "pending", true);
            break;
        }
        assert!(Instant::now() < deadline, "never pending/true: {r:?}");
    }
    reader.release().await.unwrap();
    assert!(waiting.await.unwrap().unwrap(), "acquired in time");
    let r = replies(Py::start(&server, &["ping", &c, "0.5"]).rest().await);
    assert_eq!(r.len(), 1, "{r:?}");
    id_re(&r[0], "exclusive", true);
    writer.release().await.unwrap();
    // Exclusive through the fast path: elected false.
    let alone = lock_on(&store, &c);
    assert!(alone.try_acquire().await.unwrap());
    let r = replies(Py::start(&server, &["ping", &c, "0.5"]).rest().await);
    id_re(&r[0], "exclusive", false);
    alone.release().await.unwrap();
}

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
    rust.release().await.unwrap();
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
    rust.release().await.unwrap();
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
    rust.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_rust_holder_is_reaped_by_python_and_told_without_resubscribing() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("wedged-rust");
    let rust = lock_on(&store, &c);
    assert!(rust.try_acquire().await.unwrap());
    let name = store.connection_name(rust.key()).unwrap();
    assert!(
        server
            .cli(&["CLIENT", "LIST"])
            .contains(&format!("name={name} "))
    );
    let mut keep_alive = rust.keep_alive().unwrap();
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
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rust.is_acquired().await.unwrap());
    let records = python_probe(&server, &c).await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["mode"], "exclusive");
    rust.release().await.unwrap();
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
    assert_eq!(
        server.cli(&["PUBSUB", "NUMSUB", &c]).lines().nth(1),
        Some("1"),
        "the foreign subscriber is still there"
    );
    assert!(!rust.is_acquired().await.unwrap());
    sub.kill().unwrap();
    sub.wait().unwrap();
}

/// Two exclusive and two shared loops in each language on one channel: no interval of a writer
/// overlaps any other interval.
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
    let iterations = "6";
    let mut pythons: Vec<Py> = ["exclusive", "exclusive", "shared", "shared"]
        .iter()
        .map(|mode| {
            Py::start(
                &server,
                &[
                    "loop",
                    &c,
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
        .collect();
    let intervals = Arc::new(std::sync::Mutex::new(Vec::<(f64, f64, bool, String)>::new()));
    let waits = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let mut rust = Vec::new();
    for (i, write) in [true, true, false, false].into_iter().enumerate() {
        let store = store.clone();
        let c = c.clone();
        let (intervals, waits) = (intervals.clone(), waits.clone());
        rust.push(tokio::spawn(async move {
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
                    .push((start, end, write, format!("rust-{i}")));
                lock.release().await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    for task in rust {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .unwrap()
            .unwrap();
    }
    let mut all = intervals.lock().unwrap().clone();
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
    assert_eq!(all.len(), 48);
    let mut violations = Vec::new();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if (a.2 || b.2) && a.0 < b.1 && b.0 < a.1 {
                violations.push((a.clone(), b.clone()));
            }
        }
    }
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
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/pubsub_peer.py");
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
    runtime.block_on(rust.release()).unwrap();
}

/// Writers of both languages pending behind a reader: the lowest id is elected and goes first
/// (a Python writer forced to 0…0), and every writer gets its turn, one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_writers_of_both_languages_elect_the_lowest_id_first() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("election");
    let reader = lock_on(&store, &c);
    assert!(reader.try_acquire_read().await.unwrap());
    let (low, high) = ("0".repeat(32), "f".repeat(32));
    let args = |id: &str| -> Vec<String> {
        [
            "hold",
            &c,
            "exclusive",
            "--holder-id",
            id,
            "--check-interval",
            "0.02",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let start = |id: &str| {
        let a = args(id);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Py::start(&server, &a)
    };
    let mut first = start(&low);
    // 0…0 is the incumbent before the others arrive.
    let deadline = Instant::now() + SOON;
    loop {
        let records = python_probe(&server, &c).await;
        if records
            .iter()
            .any(|r| r["holder_id"] == low.as_str() && r["elected"] == true)
        {
            break;
        }
        assert!(Instant::now() < deadline, "0…0 never elected: {records:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut last = start(&high);
    let writer = lock_on(&store, &c);
    let rust = {
        let writer = writer.clone();
        tokio::spawn(async move {
            assert!(writer.acquire_timeout(SOON * 3).await.unwrap());
            let at = now();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let until = now();
            writer.release().await.unwrap();
            (at, until)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    reader.release().await.unwrap();
    let first_at: f64 = first
        .expect("ACQUIRED", SOON)
        .await
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release();
    let first_until: f64 = first
        .expect("RELEASING", SOON)
        .await
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let last_at: f64 = last
        .expect("ACQUIRED", SOON * 2)
        .await
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    last.release();
    let last_until: f64 = last
        .expect("RELEASING", SOON)
        .await
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let (rust_at, rust_until) = rust.await.unwrap();
    assert!(first_at < rust_at && first_at < last_at, "0…0 first");
    for (a, b) in [
        ((first_at, first_until), (rust_at, rust_until)),
        ((first_at, first_until), (last_at, last_until)),
        ((rust_at, rust_until), (last_at, last_until)),
    ] {
        assert!(
            !(a.0 < b.1 && b.0 < a.1),
            "one writer at a time: {a:?} {b:?}"
        );
    }
}
