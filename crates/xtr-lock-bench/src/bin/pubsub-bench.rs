//! The pub/sub store against portalocker 4.4.2's RedisLock and the floor (a PING round trip),
//! side by side on one throwaway redis-server, in interleaved rounds.
//!
//! `cargo run --release -p xtr-lock-bench --bin pubsub-bench` prints a Markdown table; run it
//! under `taskset -c 0` too for the other placement (everything on one vCPU).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, RedisPubSubStore};
use xtr_lock_bench::{
    Summary, cell, human, lock_handoffs, monotonic_ns, park, peer_script, redis_benchmark,
    run_python,
};
use xtr_lock_testkit::redis::RedisServer;

const ROUNDS: usize = 3;
const CYCLES: usize = 300;
const PY_CYCLES: usize = 30;
const HANDOFFS: usize = 30;
const PY_HANDOFFS: usize = 8;
const MIXED: usize = 8;
const KILLS: usize = 8;
/// Writer acquisitions per round under four churning portalocker readers.
const CHURNED: usize = 3;

fn main() {
    let server = RedisServer::start();
    let dsn = format!("redis+pubsub://127.0.0.1:{}", server.port());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let factory = LockFactory::new(RedisPubSubStore::from_dsn(&dsn).unwrap());
    eprintln!("redis-server on port {}", server.port());
    let ping = redis_benchmark(&server, &["-c", "1", "-n", "20000", "-t", "ping"]);
    let port = server.port().to_string();

    let mut s = Samples::default();
    rt.block_on(async {
        // Warm: connections, the listener.
        let lock = factory.create_lock("bench-cycle");
        for _ in 0..20 {
            assert!(lock.try_acquire().await.unwrap());
            let _ = lock.release().await.unwrap();
        }
    });
    for round in 0..ROUNDS {
        eprintln!("round {}/{ROUNDS}", round + 1);
        rt.block_on(async {
            let lock = factory.create_lock("bench-cycle");
            for _ in 0..CYCLES {
                let t0 = Instant::now();
                assert!(lock.try_acquire().await.unwrap());
                let t1 = Instant::now();
                let _ = lock.release().await.unwrap();
                s.acquire.push(t1 - t0);
                s.release.push(t1.elapsed());
                s.cycle.push(t0.elapsed());
            }
            let h = lock_handoffs(&factory, "bench-handoff", HANDOFFS).await;
            s.handoff.push(h);
        });
        let py = run_python(
            "pubsub_bench.py",
            &[port.clone(), "cycle".into(), PY_CYCLES.to_string()],
        );
        s.py_acquire.extend(nanos(&py["acquire"]));
        s.py_release.extend(nanos(&py["release"]));
        s.py_cycle.extend(nanos(&py["cycle"]));
        let py = run_python(
            "pubsub_bench.py",
            &[port.clone(), "handoff".into(), PY_HANDOFFS.to_string()],
        );
        s.py_handoff.extend(nanos(&py["handoff"]));
        for i in 0..MIXED {
            s.rust_to_py
                .push(rt.block_on(rust_to_python(&factory, &port, i)));
            s.py_to_rust
                .push(rt.block_on(python_to_rust(&factory, &port, i)));
        }
        for i in 0..KILLS {
            s.kill_rust_waits
                .push(rt.block_on(kill_python_holder_rust_waits(&factory, &port, i)));
            s.kill_py_waits
                .push(kill_python_holder_python_waits(&port, i));
            s.kill_floor
                .push(kill_python_holder_count_drops(&server, &port, i));
        }
    }
    for round in 0..ROUNDS {
        eprintln!("reader churn {}/{ROUNDS}", round + 1);
        s.churn_rust
            .extend(rt.block_on(churned_rust_writer(&factory, &port, round)));
        s.churn_py.extend(churned_python_writer(&port, round));
    }
    let floor = Duration::from_secs_f64(ping.p50_ms / 1000.0);
    let sum = |v: &Vec<Duration>| Summary::of(v.clone());
    let handoff = Summary::of(s.handoff.iter().map(|h| h.p50).collect());
    println!("| pub/sub store, p50 (p99) | xtr-lock (Rust) | portalocker 4.4.2 | ratio (p50) |");
    println!("|---|---|---|---|");
    let row = |what: &str, ours: &Summary, theirs: &Summary| {
        println!(
            "| {what} | {} | {} | {:.1}× |",
            cell(ours),
            cell(theirs),
            theirs.p50.as_secs_f64() / ours.p50.as_secs_f64()
        );
    };
    row(
        "uncontended acquire (exclusive)",
        &sum(&s.acquire),
        &sum(&s.py_acquire),
    );
    row("release", &sum(&s.release), &sum(&s.py_release));
    row("acquire + release", &sum(&s.cycle), &sum(&s.py_cycle));
    row(
        "hand-off within the library (release → waiter holds)",
        &handoff,
        &sum(&s.py_handoff),
    );
    row(
        "SIGKILL of a portalocker holder → waiter holds",
        &sum(&s.kill_rust_waits),
        &sum(&s.kill_py_waits),
    );
    println!(
        "| (floor: SIGKILL of a portalocker holder → the server's count drops, polled without pause) | {} | | |",
        cell(&sum(&s.kill_floor))
    );
    let churn = |v: &Vec<Duration>| {
        let sum = Summary::of(v.clone());
        format!("{} (max {})", human(sum.p50), human(sum.max))
    };
    println!(
        "| a writer's wait under 4 portalocker readers churning (0.3 s holds, back to back), p50 (max) | {} | {} | |",
        churn(&s.churn_rust),
        churn(&s.churn_py)
    );
    println!();
    println!("| mixed hand-off, p50 (p99) | time |");
    println!("|---|---|");
    println!(
        "| xtr-lock releases → portalocker waiter holds | {} |",
        cell(&sum(&s.rust_to_py))
    );
    println!(
        "| portalocker begins to release → xtr-lock waiter holds | {} |",
        cell(&sum(&s.py_to_rust))
    );
    println!();
    let cycle = sum(&s.cycle);
    println!(
        "PING round trip (redis-benchmark -c 1): {}; our acquire + release = {:.1} PINGs",
        human(floor),
        cycle.p50.as_secs_f64() / floor.as_secs_f64()
    );
    println!(
        "({ROUNDS} interleaved rounds; ours: {} cycles, {} hand-offs (the median of each round's p50), \
         {} mixed each way, {} kills; portalocker: {} cycles, {} hand-offs, {} kills)",
        s.cycle.len(),
        s.handoff.len() * HANDOFFS,
        s.rust_to_py.len(),
        s.kill_rust_waits.len(),
        s.py_cycle.len(),
        s.py_handoff.len(),
        s.kill_py_waits.len()
    );
}

#[derive(Default)]
struct Samples {
    acquire: Vec<Duration>,
    release: Vec<Duration>,
    cycle: Vec<Duration>,
    handoff: Vec<Summary>,
    py_acquire: Vec<Duration>,
    py_release: Vec<Duration>,
    py_cycle: Vec<Duration>,
    py_handoff: Vec<Duration>,
    rust_to_py: Vec<Duration>,
    py_to_rust: Vec<Duration>,
    kill_rust_waits: Vec<Duration>,
    kill_py_waits: Vec<Duration>,
    kill_floor: Vec<Duration>,
    churn_rust: Vec<Duration>,
    churn_py: Vec<Duration>,
}

fn nanos(v: &serde_json::Value) -> Vec<Duration> {
    v.as_array()
        .expect("samples")
        .iter()
        .map(|n| Duration::from_nanos(n.as_u64().expect("ns")))
        .collect()
}

/// portalocker holding (or waiting to hold) `channel`, its lines on a channel.
struct PyHolder {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl PyHolder {
    fn start(port: &str, channel: &str) -> PyHolder {
        let mut child = Command::new(xtr_lock_testkit::python::python_with_peers())
            .arg(peer_script("pubsub_bench.py"))
            .args([port, "hold", channel])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python with portalocker");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        PyHolder {
            stdin: child.stdin.take().unwrap(),
            child,
            lines,
        }
    }

    /// The monotonic time on the next line starting with `word`.
    fn at(&self, word: &str) -> u64 {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("portalocker never said {word}"));
            if let Some(ns) = line.strip_prefix(word) {
                return ns.trim().parse().unwrap();
            }
        }
    }

    fn release(&mut self) {
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    fn finish(mut self) {
        let _ = self.stdin.write_all(b"\n");
        let _ = self.child.wait();
    }
}

/// Four portalocker reader processes churning on a channel for as long as `work` runs.
fn churning_readers(port: &str, channel: &str, seconds: u64) -> Vec<Child> {
    (0..4)
        .map(|_| {
            Command::new(xtr_lock_testkit::python::python_with_peers())
                .arg(peer_script("pubsub_bench.py"))
                .args([port, "readers", channel, &seconds.to_string()])
                .spawn()
                .expect("python with portalocker")
        })
        .collect()
}

/// Our writer's waits for [`CHURNED`] exclusive acquisitions under churning readers.
async fn churned_rust_writer(factory: &LockFactory, port: &str, round: usize) -> Vec<Duration> {
    let channel = format!("bench-churn-r-{round}");
    let readers = churning_readers(port, &channel, 60);
    tokio::time::sleep(Duration::from_secs(1)).await; // they are reading
    let mut waits = Vec::new();
    for _ in 0..CHURNED {
        let writer = factory.create_lock(&channel);
        let t = Instant::now();
        assert!(
            writer
                .acquire_timeout(Duration::from_secs(60))
                .await
                .unwrap()
        );
        waits.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = writer.release().await.unwrap();
    }
    for mut r in readers {
        let _ = r.kill();
        let _ = r.wait();
    }
    waits
}

/// portalocker's writer's waits, the same way.
fn churned_python_writer(port: &str, round: usize) -> Vec<Duration> {
    let channel = format!("bench-churn-p-{round}");
    let readers = churning_readers(port, &channel, 90);
    std::thread::sleep(Duration::from_secs(1));
    let out = run_python(
        "pubsub_bench.py",
        &[
            port.to_owned(),
            "writer".into(),
            channel,
            CHURNED.to_string(),
        ],
    );
    for mut r in readers {
        let _ = r.kill();
        let _ = r.wait();
    }
    nanos(&out["waits"])
}

/// Our holder releases while a portalocker waiter waits: release → it holds.
async fn rust_to_python(factory: &LockFactory, port: &str, i: usize) -> Duration {
    let channel = format!("bench-r2p-{i}");
    let holder = factory.create_lock(&channel);
    assert!(holder.try_acquire().await.unwrap());
    let py = PyHolder::start(port, &channel);
    // Interpreter start-up, then the waiter is parked somewhere in its poll.
    tokio::time::sleep(Duration::from_millis(400) + park(i)).await;
    let released = monotonic_ns();
    let _ = holder.release().await.unwrap();
    let got = py.at("ACQUIRED");
    py.finish();
    Duration::from_nanos(got - released)
}

/// Our waiter on `channel`, in a task: the monotonic time it held at (it releases at once).
fn waiter(factory: &LockFactory, channel: &str) -> tokio::task::JoinHandle<u64> {
    let waiter = factory.create_lock(channel);
    tokio::spawn(async move {
        waiter.acquire().await.unwrap();
        let at = monotonic_ns();
        let _ = waiter.release().await.unwrap();
        at
    })
}

/// A portalocker holder begins to release while our waiter waits: that moment → we hold.
async fn python_to_rust(factory: &LockFactory, port: &str, i: usize) -> Duration {
    let channel = format!("bench-p2r-{i}");
    let mut py = PyHolder::start(port, &channel);
    py.at("ACQUIRED");
    let task = waiter(factory, &channel);
    tokio::time::sleep(park(i)).await;
    py.release();
    let releasing = py.at("RELEASING");
    let got = task.await.unwrap();
    py.finish();
    Duration::from_nanos(got.saturating_sub(releasing))
}

/// A portalocker holder is SIGKILLed while our waiter waits: the kill → we hold.
async fn kill_python_holder_rust_waits(factory: &LockFactory, port: &str, i: usize) -> Duration {
    let channel = format!("bench-kill-r-{i}");
    let mut py = PyHolder::start(port, &channel);
    py.at("ACQUIRED");
    let task = waiter(factory, &channel);
    tokio::time::sleep(park(i)).await;
    let killed = monotonic_ns();
    py.child.kill().unwrap();
    let got = task.await.unwrap();
    let _ = py.child.wait();
    Duration::from_nanos(got - killed)
}

/// A portalocker holder is SIGKILLed: the kill → `PUBSUB NUMSUB` says it is gone (asked over and
/// over, on a connection of its own): how long the process takes to die and the server to see
/// its socket close.
fn kill_python_holder_count_drops(server: &RedisServer, port: &str, i: usize) -> Duration {
    let channel = format!("bench-kill-floor-{i}");
    let mut py = PyHolder::start(port, &channel);
    py.at("ACQUIRED");
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", server.port())).unwrap();
    let mut conn = client.get_connection().unwrap();
    std::thread::sleep(park(i));
    let killed = monotonic_ns();
    py.child.kill().unwrap();
    loop {
        let (_, n): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query::<Vec<(String, u64)>>(&mut conn)
            .unwrap()
            .remove(0);
        if n == 0 {
            break;
        }
    }
    let gone = monotonic_ns();
    let _ = py.child.wait();
    Duration::from_nanos(gone - killed)
}

/// A portalocker holder is SIGKILLed while a portalocker waiter waits: the kill → it holds.
fn kill_python_holder_python_waits(port: &str, i: usize) -> Duration {
    let channel = format!("bench-kill-p-{i}");
    let mut holder = PyHolder::start(port, &channel);
    holder.at("ACQUIRED");
    let waiter = PyHolder::start(port, &channel);
    std::thread::sleep(Duration::from_millis(400) + park(i));
    let killed = monotonic_ns();
    holder.child.kill().unwrap();
    let _ = holder.child.wait();
    let got = waiter.at("ACQUIRED");
    waiter.finish();
    Duration::from_nanos(got - killed)
}
