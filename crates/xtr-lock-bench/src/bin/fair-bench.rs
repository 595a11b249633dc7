//! What fair waiting costs and buys on Redis, side by side in one run on one throwaway
//! redis-server: the same workloads on a store with the default fair queue and on one opened
//! with `?fair=false` (newcomers barge, as before the queue was fair), in interleaved rounds.
//!
//! - Writers' waits under a stream of readers: 20 contenders on one resource, 18 readers and
//!   2 writers (90 % readers), each holding 1 ms and asking again at once, for a few seconds a
//!   round: the writers' wait p50, p99 and max, and how many sections each mode ran.
//! - Throughput: 64 tasks cycling (acquire, release) over 64 resources, a random one each time.
//!
//! `cargo run --release -p xtr-lock-bench --bin fair-bench` prints Markdown tables.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng as _;
use xtr_lock::{LockFactory, Lockable as _, RedisStore};
use xtr_lock_bench::{Summary, human};
use xtr_lock_testkit::redis::RedisServer;

const TTL: Duration = Duration::from_secs(30);
const ROUNDS: usize = 3;
const STREAM_FOR: Duration = Duration::from_secs(4);
const CYCLES_FOR: Duration = Duration::from_secs(3);

fn main() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fair = RedisStore::from_dsn(&server.url(0)).unwrap();
    let barging = RedisStore::from_dsn(&format!("{}?fair=false", server.url(0))).unwrap();
    let mut waits = [Vec::new(), Vec::new()];
    let mut sections = [(0u64, 0u64), (0, 0)];
    let mut starved = [0u64, 0];
    let mut cycles = [0u64, 0];
    for round in 0..ROUNDS {
        for (i, store) in [&fair, &barging].into_iter().enumerate() {
            let name = format!("stream-{round}-{i}");
            let got = rt.block_on(reader_stream(store, &name));
            waits[i].extend(got.writer_waits);
            sections[i].0 += got.reads;
            sections[i].1 += got.writes;
            starved[i] += got.unfinished;
            cycles[i] += rt.block_on(throughput(store, &format!("many-{round}-{i}")));
        }
    }
    println!(
        "| 20 contenders, 90 % readers, {ROUNDS} × {} s | writer's wait p50 | p99 | max | writes | reads | writers that waited 8 s and gave up |",
        STREAM_FOR.as_secs()
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, label) in ["fair (default)", "`fair=false` (barging)"]
        .iter()
        .enumerate()
    {
        let s = Summary::of(waits[i].clone());
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} |",
            human(s.p50),
            human(s.p99),
            human(s.max),
            sections[i].1,
            sections[i].0,
            starved[i]
        );
    }
    println!();
    println!(
        "| 64 tasks × 64 resources, {ROUNDS} × {} s | cycles / s | ratio |",
        CYCLES_FOR.as_secs()
    );
    println!("|---|---|---|");
    let secs = (ROUNDS as f64) * CYCLES_FOR.as_secs_f64();
    let rate = |c: u64| c as f64 / secs;
    println!(
        "| fair (default) | {:.0} | {:.3} |",
        rate(cycles[0]),
        cycles[0] as f64 / cycles[1] as f64
    );
    println!("| `fair=false` (barging) | {:.0} | 1 |", rate(cycles[1]));
}

struct Stream {
    writer_waits: Vec<Duration>,
    reads: u64,
    writes: u64,
    /// Writers whose last wait had not ended when the round stopped (a starved writer's wait
    /// is not among the samples otherwise).
    unfinished: u64,
}

/// 18 readers and 2 writers on `resource`, each holding 1 ms and asking again at once.
async fn reader_stream(store: &RedisStore, resource: &str) -> Stream {
    let factory = LockFactory::new(store.clone()).with_ttl(Some(TTL));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for n in 0..20 {
        let lock = factory.create_lock(resource);
        let (stop, reads) = (stop.clone(), reads.clone());
        let writer = n % 10 == 0;
        let task = tokio::spawn(async move {
            let mut waits = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let got = if writer {
                    lock.acquire_timeout(STREAM_FOR * 2).await.unwrap()
                } else {
                    lock.acquire_read_timeout(STREAM_FOR * 2).await.unwrap()
                };
                if !got {
                    return (waits, true);
                }
                if writer {
                    waits.push(asked.elapsed());
                } else {
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                let _ = lock.release().await.unwrap();
            }
            (waits, false)
        });
        if writer {
            writers.push(task);
        } else {
            readers.push(task);
        }
    }
    tokio::time::sleep(STREAM_FOR).await;
    stop.store(true, Ordering::Relaxed);
    let mut out = Stream {
        writer_waits: Vec::new(),
        reads: 0,
        writes: 0,
        unfinished: 0,
    };
    for r in readers {
        r.await.unwrap();
    }
    for w in writers {
        let (waits, gave_up) = w.await.unwrap();
        out.writes += waits.len() as u64;
        // A wait still going when the readers stop ends then: it is among the samples; one
        // that outlasted twice the round gave up and is counted here.
        if gave_up {
            out.unfinished += 1;
        }
        out.writer_waits.extend(waits);
    }
    out.reads = reads.load(Ordering::Relaxed);
    out
}

/// 64 tasks cycling over 64 resources for [`CYCLES_FOR`]: how many cycles in all.
async fn throughput(store: &RedisStore, prefix: &str) -> u64 {
    let factory = LockFactory::new(store.clone()).with_ttl(Some(TTL));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (factory, stop, done) = (factory.clone(), stop.clone(), done.clone());
            let prefix = prefix.to_owned();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = rand::rng().random_range(0..64);
                    let lock = factory.create_lock(format!("{prefix}-{n}"));
                    lock.acquire().await.unwrap();
                    let _ = lock.release().await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(CYCLES_FOR).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed)
}
