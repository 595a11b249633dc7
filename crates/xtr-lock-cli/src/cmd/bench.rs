//! `xtr-lock bench`: what a store costs, measured like redis-benchmark or pgbench measure theirs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use xtr_lock::{LockFactory, Lockable as _};

use anyhow::{Result, anyhow};
use serde_json::json;

use crate::args::BenchSettings;
use crate::exit::Exit;
use crate::output::short;
use crate::store::StoreConfig;

const CYCLES: usize = 1000;
const HANDOFFS: usize = 50;
const TTL: Duration = Duration::from_secs(30);

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// `bench`: uncontended latency, hand-off latency, then throughput, printed as a table or JSON.
pub(crate) async fn bench(store: StoreConfig, args: BenchSettings) -> Result<Exit> {
    if args.clients == 0 || args.resources == 0 {
        return Err(anyhow!("--clients and --resources must be at least 1"));
    }
    let tag = format!("xtr-lock-bench:{}", std::process::id());
    let factory = store.factory().with_ttl(Some(TTL));
    let cycles = cycles(&factory, &tag).await?;
    let handoffs = handoffs(&factory, &tag).await?;
    let rate = throughput(&factory, &tag, &args).await?;
    print(&store, &args, &cycles, &handoffs, rate);
    Ok(Exit::Ok)
}

/// [`CYCLES`] uncontended acquire + release, sorted.
async fn cycles(factory: &LockFactory, tag: &str) -> Result<Vec<Duration>> {
    let lock = factory.create_lock(format!("{tag}:cycle"));
    let mut cycles = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let t = Instant::now();
        if !lock.try_acquire().await? {
            return Err(anyhow!(
                "the benchmark's own resource {tag}:cycle is held by someone else"
            ));
        }
        let _ = lock.release().await?;
        cycles.push(t.elapsed());
    }
    cycles.sort_unstable();
    Ok(cycles)
}

/// [`HANDOFFS`] times from a release to the waiter's acquire, sorted.
async fn handoffs(factory: &LockFactory, tag: &str) -> Result<Vec<Duration>> {
    let holder = factory.create_lock(format!("{tag}:handoff"));
    let mut handoffs = Vec::with_capacity(HANDOFFS);
    for _ in 0..HANDOFFS {
        holder.acquire().await?;
        let waiter = factory.create_lock(format!("{tag}:handoff"));
        let task = tokio::spawn(async move {
            waiter.acquire().await?;
            let got = Instant::now();
            let _ = waiter.release().await?;
            Ok::<_, xtr_lock::Error>(got)
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        let _ = holder.release().await?;
        handoffs.push(task.await??.saturating_duration_since(released));
    }
    handoffs.sort_unstable();
    Ok(handoffs)
}

/// Acquire + release per second of `--clients` spread over `--resources`, for `--duration`.
async fn throughput(factory: &LockFactory, tag: &str, args: &BenchSettings) -> Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..args.clients {
        let lock = factory.create_lock(format!("{tag}:rate:{}", i % args.resources));
        let (done, stop, hold) = (done.clone(), stop.clone(), args.hold);
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                lock.acquire().await?;
                if !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                }
                let _ = lock.release().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, xtr_lock::Error>(())
        }));
    }
    let t = Instant::now();
    tokio::time::sleep(args.duration).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64())
}

/// The measurements, as a table or (`--json`) one JSON object.
fn print(
    store: &StoreConfig,
    args: &BenchSettings,
    cycles: &[Duration],
    handoffs: &[Duration],
    rate: f64,
) {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    if args.json {
        println!(
            "{}",
            json!({
                "store": store.scheme,
                "uncontended_us": {"n": CYCLES, "p50": us(percentile(cycles, 0.5)), "p99": us(percentile(cycles, 0.99))},
                "handoff_us": {"n": HANDOFFS, "p50": us(percentile(handoffs, 0.5)), "p99": us(percentile(handoffs, 0.99))},
                "throughput": {"clients": args.clients, "resources": args.resources, "hold_ms": args.hold.as_millis() as u64, "per_second": rate},
            })
        );
        return;
    }
    let cell = |s: &[Duration]| {
        format!(
            "{:.1} µs (p99 {:.1} µs)",
            us(percentile(s, 0.5)),
            us(percentile(s, 0.99))
        )
    };
    println!("store: {}", store.store);
    println!(
        "uncontended acquire + release  {}  [{CYCLES} cycles]",
        cell(cycles)
    );
    println!(
        "hand-off (release → waiter)    {}  [{HANDOFFS} hand-offs]",
        cell(handoffs)
    );
    println!(
        "throughput                     {rate:.0} acquire+release/s  [{} clients, {} resources, hold {}, {}]",
        args.clients,
        args.resources,
        short(args.hold),
        short(args.duration)
    );
}
