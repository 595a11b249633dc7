//! The uncontended acquire + release cycle of two builds of this library, side by side: what a
//! change to the lock core costs on the hot path (memory, flock, Redis, SQLite, Memcached).
//!
//! `cycle-bench --one DSN ROUNDS` runs this build's cycle on one store and prints one p50 in
//! nanoseconds per round. `cycle-bench --compare BEFORE AFTER ROUNDS` starts a throwaway Redis
//! server and a temp dir, then runs the two binaries (each a `cycle-bench` built from one
//! revision) on every store in interleaved A B B A rounds, and prints a Markdown table of the
//! medians of the round p50s and their ratio. Pin it with `taskset` to measure one placement;
//! `CYCLE_ONLY=memory,flock` limits the stores.

use std::process::Command;
use std::time::Duration;

use xtr_lock::{Lockable as _, StoreFactory};
use xtr_lock_bench::lock_cycles;

const PER_ROUND: usize = 2_000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--one") if args.len() == 4 => one(&args[2], args[3].parse().unwrap_or(1)),
        Some("--compare") if args.len() == 5 => {
            compare(&args[2], &args[3], args[4].parse().unwrap_or(6));
        }
        _ => {
            eprintln!("usage: cycle-bench --one DSN ROUNDS | --compare BEFORE AFTER ROUNDS");
            std::process::exit(2);
        }
    }
}

/// This build's cycle on `dsn`: one p50 (ns) per round on stdout.
fn one(dsn: &str, rounds: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = StoreFactory::create_store(dsn).unwrap();
        let factory = xtr_lock::LockFactory::from_arc(store).with_ttl(
            if dsn.starts_with("redis") || dsn.starts_with("sqlite") {
                Some(Duration::from_secs(30))
            } else {
                None
            },
        );
        let lock = factory.create_lock(format!("cycle-{}", std::process::id()));
        // Warm-up: connections, scripts, the table.
        let _ = lock_cycles(&lock, 200, 10).await;
        for _ in 0..rounds {
            let s = lock_cycles(&lock, 0, PER_ROUND).await;
            println!("{}", s.p50.as_nanos());
        }
        let _ = lock.release().await;
    });
}

fn run_one(binary: &str, dsn: &str) -> Vec<f64> {
    let out = Command::new(binary)
        .args(["--one", dsn, "1"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {binary}: {e}"));
    assert!(
        out.status.success(),
        "{binary} --one {dsn} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn compare(before: &str, after: &str, rounds: usize) {
    let redis = xtr_lock_testkit::redis::RedisServer::start();
    let memcached = xtr_lock_testkit::memcached::MemcachedServer::start();
    let dir = tempfile::tempdir().unwrap();
    let stores = [
        ("memory", "in-memory".to_owned()),
        ("flock", format!("flock://{}", dir.path().display())),
        ("Redis", format!("redis://127.0.0.1:{}", redis.port())),
        (
            "SQLite",
            format!(
                "sqlite://{}/locks.db?create_table=true",
                dir.path().display()
            ),
        ),
        ("Memcached", memcached.url()),
    ];
    let only = std::env::var("CYCLE_ONLY").ok();
    println!("| store | before: p50 | after: p50 | after / before |");
    println!("|---|---|---|---|");
    for (name, dsn) in &stores {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|s| s.eq_ignore_ascii_case(name)))
        {
            continue;
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // A B B A: drift in the machine's state falls on both sides alike.
            if round % 2 == 0 {
                a.extend(run_one(before, dsn));
                b.extend(run_one(after, dsn));
            } else {
                b.extend(run_one(after, dsn));
                a.extend(run_one(before, dsn));
            }
        }
        let (a, b) = (median(a), median(b));
        println!(
            "| {name} | {:.1} µs | {:.1} µs | {:.3}× |",
            a / 1e3,
            b / 1e3,
            b / a
        );
    }
}
