//! Shared pieces of the benchmark binaries: a clock comparable across processes, latency
//! summaries, and the side-by-side table.

use std::time::{Duration, Instant};

pub use xtr_lock_testkit::delay_proxy;

use xtr_lock::{Lock, LockFactory, Lockable as _};

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process of the machine (Python's
/// `time.monotonic_ns()` reads it too), so a release in one process and an acquisition in
/// another can be compared.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// Percentiles of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// How many samples.
    pub n: usize,
    /// The median.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The slowest sample (the p99 where only percentiles were given).
    pub max: Duration,
}

impl Summary {
    /// Summarises `samples` (consumed, sorted here).
    pub fn of(mut samples: Vec<Duration>) -> Summary {
        assert!(!samples.is_empty(), "no samples");
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Summary {
            n: samples.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: at(1.0),
        }
    }

    /// From `{"n": …, "p50_us": …, "p99_us": …}`, as the Python and PHP halves print it.
    pub fn from_json(v: &serde_json::Value) -> Summary {
        let us = |k: &str| Duration::from_secs_f64(v[k].as_f64().expect("a latency") / 1e6);
        Summary {
            n: v["n"].as_u64().expect("a sample count") as usize,
            p50: us("p50_us"),
            p99: us("p99_us"),
            max: us("p99_us"),
        }
    }

    /// Rounds summarised apart (a peer's half prints percentiles, not samples): the median of
    /// their medians and the worst p99.
    pub fn merge(rounds: &[Summary]) -> Summary {
        assert!(!rounds.is_empty(), "no rounds");
        let mut p50: Vec<Duration> = rounds.iter().map(|s| s.p50).collect();
        p50.sort();
        let p99 = rounds.iter().map(|s| s.p99).max().unwrap();
        Summary {
            n: rounds.iter().map(|s| s.n).sum(),
            p50: p50[p50.len() / 2],
            p99,
            max: p99,
        }
    }
}

/// Runs a peer's half of a benchmark and reads the JSON it prints on stdout.
fn run_json(mut cmd: std::process::Command, what: &str) -> serde_json::Value {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what} printed no JSON: {e}"))
}

/// Runs `peers/<script>` with the peers' Python (the testkit's venv) and `args`, and reads the JSON
/// object it prints.
pub fn run_python(script: &str, args: &[String]) -> serde_json::Value {
    let mut cmd = std::process::Command::new(xtr_lock_testkit::python::python_with_peers());
    cmd.arg(peer_script(script)).args(args);
    run_json(cmd, &format!("the Python benchmark {script}"))
}

/// Runs `peers/symfony_bench.php` (php-cli with php-redis and php-symfony-lock) with `args`, and
/// reads the JSON object it prints.
pub fn run_php(args: &[String]) -> serde_json::Value {
    let mut cmd = std::process::Command::new("php");
    cmd.arg(peer_script("symfony_bench.php")).args(args);
    run_json(
        cmd,
        "the PHP benchmark (php-cli, php-redis, php-symfony-lock)",
    )
}

/// Runs the php half `peers/<script>` with `args` and reads the summary it prints (`{n, p50_us,
/// p99_us}`).
pub fn php_summary(script: &str, args: &[&str]) -> Summary {
    let mut cmd = std::process::Command::new("php");
    cmd.arg(peer_script(script)).args(args);
    Summary::from_json(&run_json(
        cmd,
        "the PHP benchmark (php-cli, php-symfony-lock and the store's extension)",
    ))
}

/// The path of a peer's half of a benchmark, `peers/<name>`.
pub fn peer_script(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("peers")
        .join(name)
}

/// A duration as a short human string in µs or ms.
pub fn human(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.1} µs")
    } else {
        format!("{:.2} ms", us / 1000.0)
    }
}

/// `p50 (p99)`.
pub fn cell(s: &Summary) -> String {
    format!("{} ({})", human(s.p50), human(s.p99))
}

/// How long a holder keeps the lock after the waiter parks, in hand-off round `i`: spread over
/// 5–104 ms so that pollers (the peers) are caught at every phase of their poll; a fixed delay
/// would flatter or punish them. The Python halves use the same spread.
pub fn park(i: usize) -> Duration {
    Duration::from_millis(5 + (i as u64 * 37) % 100)
}

/// `n` uncontended acquire + release cycles of `lock`, after `warmup` unmeasured ones
/// (connections, probes, scripts).
pub async fn lock_cycles(lock: &Lock, warmup: usize, n: usize) -> Summary {
    for _ in 0..warmup {
        assert!(lock.try_acquire().await.unwrap());
        let _ = lock.release().await.unwrap();
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        assert!(lock.try_acquire().await.unwrap());
        let _ = lock.release().await.unwrap();
        samples.push(t.elapsed());
    }
    Summary::of(samples)
}

/// `n` hand-offs in one process: a holder releases [`park`]`(i)` after a waiter (another task,
/// another holder) started waiting; the sample is release → the waiter holds.
pub async fn lock_handoffs(factory: &LockFactory, resource: &str, n: usize) -> Summary {
    Summary::of(handoffs_between(factory, factory, resource, n).await)
}

/// As [`lock_handoffs`], with the holder on `holders` and the waiter on `waiters` (another store
/// instance, as in another process).
pub async fn handoffs_between(
    holders: &LockFactory,
    waiters: &LockFactory,
    resource: &str,
    n: usize,
) -> Vec<Duration> {
    let holder = holders.create_lock(resource);
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        holder.acquire().await.unwrap();
        let waiter = waiters.create_lock(resource);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let _ = ready_tx.send(());
            waiter.acquire().await.unwrap();
            let got = Instant::now();
            let _ = waiter.release().await.unwrap();
            got
        });
        ready_rx.await.unwrap();
        tokio::time::sleep(park(i)).await; // the waiter is parked
        let released = Instant::now();
        let _ = holder.release().await.unwrap();
        samples.push(task.await.unwrap() - released);
    }
    samples
}

/// What `redis-benchmark` measured.
#[derive(Debug, Clone, Copy)]
pub struct Bench {
    /// Requests per second.
    pub rps: f64,
    /// The median latency, in ms.
    pub p50_ms: f64,
}

/// Runs redis-benchmark with `--csv` and reads the last line: rps and p50 latency.
pub fn redis_benchmark(server: &xtr_lock_testkit::redis::RedisServer, args: &[&str]) -> Bench {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-p", &server.port().to_string(), "--csv"])
        .args(args)
        .output()
        .expect("redis-benchmark (package redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .last()
        .expect("redis-benchmark printed nothing");
    let fields: Vec<f64> = last
        .split("\",\"")
        .skip(1)
        .map(|f| f.trim_matches('"').parse().unwrap())
        .collect();
    Bench {
        rps: fields[0],
        p50_ms: fields[3],
    }
}

/// `n` hand-offs from `holder` to a peer process (php, python) that speaks the waiter protocol
/// on `child`'s stdin and stdout: per `go` line it prints `waiting`, waits for the lock, prints
/// the CLOCK_MONOTONIC nanoseconds at which it held, and releases. The holder releases
/// [`park`]`(i)` after the peer said it waits; the sample is release → the peer holds. Closes
/// the peer's stdin and waits for it to exit.
pub async fn handoffs_to_peer(
    holder: &Lock,
    mut child: std::process::Child,
    n: usize,
) -> Vec<Duration> {
    use std::io::{BufRead as _, Write as _};
    let mut to_child = child.stdin.take().expect("the peer's stdin is piped");
    let mut from_child =
        std::io::BufReader::new(child.stdout.take().expect("the peer's stdout is piped"));
    let mut samples = Vec::with_capacity(n);
    let mut line = String::new();
    for i in 0..n {
        holder.acquire().await.unwrap();
        writeln!(to_child, "go").unwrap();
        line.clear();
        from_child.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "waiting");
        tokio::time::sleep(park(i)).await;
        let released = monotonic_ns();
        let _ = holder.release().await.unwrap();
        line.clear();
        from_child.read_line(&mut line).unwrap();
        let got: u64 = line.trim().parse().unwrap();
        samples.push(Duration::from_nanos(got.saturating_sub(released)));
    }
    drop(to_child);
    let _ = child.wait();
    samples
}
