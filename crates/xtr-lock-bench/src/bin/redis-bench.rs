//! RedisStore against its peers and the floor, side by side in one run on one throwaway
//! redis-server: Python xtr-lock 4.1.0, Symfony Lock 5.4 (php), redis-py's `Lock`, the `rslock`
//! crate, and `redis-benchmark` (PING round trip, EVALSHA throughput).
//!
//! `cargo run --release -p xtr-lock-bench --bin redis-bench` prints a Markdown table.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use xtr_lock::Lockable as _;
use xtr_lock::{LockFactory, RedisStore};
use xtr_lock_bench::{
    Summary, cell, handoffs_to_peer, human, lock_cycles, lock_handoffs, park, peer_script,
    redis_benchmark, run_php,
};
use xtr_lock_testkit::redis::RedisServer;

const CYCLES: usize = 5_000;
const HANDOFFS: usize = 100;
const PEER_CYCLES: usize = 1_000;
const PEER_HANDOFFS: usize = 20;
const TASKS: usize = 64;
const RUN: Duration = Duration::from_secs(3);
const TTL: Duration = Duration::from_secs(30);

fn main() {
    let server = RedisServer::start();
    let dsn = server.url(0);
    // Latencies on one thread, like the peers (single-threaded Python and PHP); throughput on
    // the machine's two cores.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    eprintln!("redis-server on port {}", server.port());

    let ping = redis_benchmark(&server, &["-c", "1", "-n", "20000", "-t", "ping"]);
    let sha = server.cli(&["SCRIPT", "LOAD", "return 1"]);
    let evalsha = redis_benchmark(&server, &["-c", "64", "-n", "200000", "evalsha", &sha, "0"]);

    server.cli(&["CONFIG", "RESETSTAT"]);
    let ours_cycle = rt.block_on(cycle(&dsn));
    let script_us = evalsha_usec_per_call(&server);
    let ours_handoff = rt.block_on(handoff(&dsn));
    let ours_rate = mt.block_on(throughput(&dsn));
    let rs_cycle = rt.block_on(rslock_cycle(&dsn));
    let rs_handoff = rt.block_on(rslock_handoff(&dsn));
    let py = python(&dsn);
    let php_cycle = symfony_cycle(&server);
    let php_handoff = rt.block_on(symfony_handoff(&server));

    let ping_rtt = Duration::from_secs_f64(ping.p50_ms / 1000.0);
    println!(
        "| redis store, p50 (p99) | uncontended acquire + release | hand-off | {TASKS} tasks × {TASKS} resources |"
    );
    println!("|---|---|---|---|");
    println!(
        "| xtr-lock (Rust) | {} | {} | {:.0} cycles/s = {:.0} scripts/s |",
        cell(&ours_cycle),
        cell(&ours_handoff),
        ours_rate,
        ours_rate * 2.0
    );
    println!(
        "| Python xtr-lock 4.1.0 | {} | {} | — |",
        cell(&py.0),
        cell(&py.1)
    );
    println!(
        "| Symfony Lock 5.4 (php) | {} | {} | — |",
        cell(&php_cycle),
        cell(&php_handoff)
    );
    println!(
        "| redis-py 8.1 `Lock` | {} | {} | — |",
        cell(&py.2),
        cell(&py.3)
    );
    println!(
        "| rslock 0.10 (crate) | {} | {} | — |",
        cell(&rs_cycle),
        cell(&rs_handoff)
    );
    let script_time = Duration::from_secs_f64(2.0 * script_us / 1e6);
    println!(
        "| floor: redis-benchmark | 2 × PING = {}; + our two scripts' server time = {} | — | EVALSHA, {TASKS} clients: {:.0}/s |",
        human(ping_rtt * 2),
        human(ping_rtt * 2 + script_time),
        evalsha.rps
    );
    println!();
    println!(
        "Ratios: our cycle = {:.2}× two PING round trips ({:.2}× with the scripts' own server \
         time, {:.1} µs each, from INFO commandstats); our {TASKS}-task script rate = {:.0}% of \
         redis-benchmark's EVALSHA rate; hand-off {:.0}× faster than Python xtr-lock, {:.0}× than \
         Symfony, {:.0}× than redis-py, {:.0}× than rslock. Samples: {CYCLES} cycles and {HANDOFFS} \
         hand-offs for us, {PEER_CYCLES} and {PEER_HANDOFFS} for the peers.",
        ours_cycle.p50.as_secs_f64() / (2.0 * ping_rtt.as_secs_f64()),
        ours_cycle.p50.as_secs_f64() / (2.0 * ping_rtt.as_secs_f64() + script_time.as_secs_f64()),
        script_us,
        100.0 * ours_rate * 2.0 / evalsha.rps,
        ratio(py.1.p50, ours_handoff.p50),
        ratio(php_handoff.p50, ours_handoff.p50),
        ratio(py.3.p50, ours_handoff.p50),
        ratio(rs_handoff.p50, ours_handoff.p50),
    );
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// The server's own time per EVALSHA since the last `CONFIG RESETSTAT`, in µs.
fn evalsha_usec_per_call(server: &RedisServer) -> f64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("usec_per_call=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn factory(dsn: &str) -> LockFactory {
    LockFactory::new(RedisStore::from_dsn(dsn).unwrap()).with_ttl(Some(TTL))
}

async fn cycle(dsn: &str) -> Summary {
    lock_cycles(&factory(dsn).create_lock("bench:cycle"), 1, CYCLES).await
}

async fn handoff(dsn: &str) -> Summary {
    lock_handoffs(&factory(dsn), "bench:handoff", HANDOFFS).await
}

/// Acquire+release cycles per second, `TASKS` tasks each on its own resource, one store.
async fn throughput(dsn: &str) -> f64 {
    let factory = factory(dsn);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let lock = factory.create_lock(format!("bench:rate:{i}"));
        let (done, stop) = (done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                assert!(lock.try_acquire().await.unwrap());
                let _ = lock.release().await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // warm up
    let start = done.load(Ordering::Relaxed);
    let t = Instant::now();
    tokio::time::sleep(RUN).await;
    let count = done.load(Ordering::Relaxed) - start;
    let rate = count as f64 / t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    rate
}

async fn rslock_cycle(dsn: &str) -> Summary {
    let mut rl = rslock::LockManager::new(vec![dsn.to_owned()]);
    rl.set_retry(1, Duration::from_millis(1));
    let mut samples = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let t = Instant::now();
        let lock = rl.lock("bench:rslock-cycle", TTL).await.unwrap();
        rl.unlock(&lock).await;
        samples.push(t.elapsed());
    }
    Summary::of(samples)
}

async fn rslock_handoff(dsn: &str) -> Summary {
    let rl = Arc::new(rslock::LockManager::new(vec![dsn.to_owned()]));
    let mut samples = Vec::with_capacity(PEER_HANDOFFS);
    for i in 0..PEER_HANDOFFS {
        let held = rl
            .acquire_no_guard("bench:rslock-handoff", TTL)
            .await
            .unwrap();
        let waiter = rl.clone();
        let task = tokio::spawn(async move {
            let lock = waiter
                .acquire_no_guard("bench:rslock-handoff", TTL)
                .await
                .unwrap();
            let got = Instant::now();
            waiter.unlock(&lock).await;
            got
        });
        tokio::time::sleep(park(i)).await;
        let released = Instant::now();
        rl.unlock(&held).await;
        samples.push(task.await.unwrap() - released);
    }
    Summary::of(samples)
}

/// (xtr-lock cycle, xtr-lock hand-off, redis-py cycle, redis-py hand-off).
fn python(dsn: &str) -> (Summary, Summary, Summary, Summary) {
    let v = xtr_lock_bench::run_python(
        "redis_bench.py",
        &[
            dsn.to_owned(),
            PEER_CYCLES.to_string(),
            PEER_HANDOFFS.to_string(),
        ],
    );
    let get = |who: &str, what: &str| Summary::from_json(&v[who][what]);
    (
        get("xtr", "cycle"),
        get("xtr", "handoff"),
        get("redis_py", "cycle"),
        get("redis_py", "handoff"),
    )
}

fn symfony_cycle(server: &RedisServer) -> Summary {
    let args = [
        "127.0.0.1",
        &server.port().to_string(),
        "cycle",
        &PEER_CYCLES.to_string(),
    ];
    Summary::from_json(&run_php(&args.map(str::to_owned)))
}

/// A Symfony waiter in a php process; the holder is ours (same layout), released on
/// CLOCK_MONOTONIC, which both processes read.
async fn symfony_handoff(server: &RedisServer) -> Summary {
    let child = Command::new("php")
        .arg(peer_script("symfony_bench.php"))
        .args([
            "127.0.0.1",
            &server.port().to_string(),
            "waiter",
            "bench:php-handoff",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("php-cli");
    let holder = factory(&server.url(0)).create_lock("bench:php-handoff");
    Summary::of(handoffs_to_peer(&holder, child, PEER_HANDOFFS).await)
}
