//! portalocker 4.4.2 processes for the pub/sub interop tests (`tests/peers/pubsub_peer.py`, one
//! process per call), and what those tests share.

#![allow(dead_code)] // each test binary uses some of it

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use xtr_lock::{Lock, LockFactory, RedisPubSubStore};
use xtr_lock_testkit::redis::RedisServer;

/// A generous bound for what should take well under a second.
pub(crate) const SOON: Duration = Duration::from_secs(10);

/// portalocker's script (`tests/peers/pubsub_peer.py`), one process per call.
pub(crate) struct Py {
    pub(crate) child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Py {
    pub(crate) fn start(server: &RedisServer, args: &[&str]) -> Py {
        let python = xtr_lock_testkit::python::python_with_peers();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/pubsub_peer.py");
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
    pub(crate) async fn expect(&mut self, prefix: &str, within: Duration) -> String {
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
    pub(crate) async fn rest(&mut self) -> Vec<String> {
        while let Ok(Some(line)) = tokio::time::timeout(SOON * 6, self.lines.recv()).await {
            self.seen.push(line);
        }
        self.seen.clone()
    }

    pub(crate) fn release(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"\n");
            let _ = stdin.flush();
        }
    }

    pub(crate) fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    pub(crate) async fn exit_code(mut self) -> i32 {
        tokio::task::spawn_blocking(move || self.child.wait().unwrap().code().unwrap_or(-1))
            .await
            .unwrap()
    }
}

pub(crate) fn store(server: &RedisServer) -> RedisPubSubStore {
    RedisPubSubStore::from_dsn(&format!("redis+pubsub://127.0.0.1:{}/0", server.port())).unwrap()
}

pub(crate) fn channel(name: &str) -> String {
    format!("{name}-{}", rand_suffix())
}

pub(crate) fn rand_suffix() -> String {
    let n = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{n:08x}")
}

pub(crate) fn lock_on(store: &RedisPubSubStore, resource: &str) -> Lock {
    LockFactory::new(store.clone()).create_lock(resource)
}

pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Python's read-only probe: the JSON records it parsed.
pub(crate) async fn python_probe(server: &RedisServer, channel: &str) -> Vec<serde_json::Value> {
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

/// Probes with Python until a record satisfies `wanted` (failing after [`SOON`]).
pub(crate) async fn until_python_sees(
    server: &RedisServer,
    channel: &str,
    what: &str,
    wanted: impl Fn(&serde_json::Value) -> bool,
) {
    let deadline = std::time::Instant::now() + SOON;
    loop {
        let records = python_probe(server, channel).await;
        if records.iter().any(&wanted) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never seen: {records:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Py {
    /// The Unix time on the next line starting with `prefix`.
    pub(crate) async fn stamp(&mut self, prefix: &str, within: Duration) -> f64 {
        let line = self.expect(prefix, within).await;
        line.split(' ')
            .nth(1)
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no time in {line:?}"))
    }
}
