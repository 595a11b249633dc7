//! Quorum locks over three local redis-servers against one server, and against the `rslock`
//! crate's Redlock over the same three, in one run.
//!
//! `cargo run --release -p xtr-lock-bench --bin quorum-bench` prints a Markdown table.

use std::time::{Duration, Instant};

use xtr_lock::store::{CombinedStore, ConsensusStrategy};
use xtr_lock::{LockFactory, RedisStore};
use xtr_lock_bench::{Summary, cell, lock_cycles};
use xtr_lock_testkit::redis::RedisServer;

const CYCLES: usize = 3_000;
const TTL: Duration = Duration::from_secs(30);

async fn cycle(factory: LockFactory, resource: &str) -> Summary {
    let lock = factory.with_default_ttl(Some(TTL)).create_lock(resource);
    lock_cycles(&lock, 100, CYCLES).await
}

async fn rslock(urls: Vec<String>) -> Summary {
    let mut rl = rslock::LockManager::new(urls);
    rl.set_retry(1, Duration::from_millis(1));
    let mut samples = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES + 100 {
        let t = Instant::now();
        let lock = rl.lock("bench:rslock", TTL).await.unwrap();
        rl.unlock(&lock).await;
        if i >= 100 {
            samples.push(t.elapsed());
        }
    }
    Summary::of(samples)
}

fn main() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url(0)).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let single = rt.block_on(cycle(
        LockFactory::new(RedisStore::from_dsn(&urls[0]).unwrap()),
        "bench:single",
    ));
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let quorum = rt.block_on(cycle(
        LockFactory::new(CombinedStore::from_dsns(&refs, ConsensusStrategy).unwrap()),
        "bench:quorum",
    ));
    let red = rt.block_on(rslock(urls.clone()));
    println!("| acquire + release, p50 (p99) | time |");
    println!("|---|---|");
    println!("| xtr-lock, one redis-server | {} |", cell(&single));
    println!(
        "| xtr-lock, quorum of 3 (`CombinedStore`, consensus) | {} |",
        cell(&quorum)
    );
    println!("| rslock 0.10 Redlock over the same 3 | {} |", cell(&red));
    println!();
    println!(
        "Ratios (p50): quorum of 3 = {:.2}× one server; rslock = {:.2}× our quorum. {CYCLES} cycles each.",
        quorum.p50.as_secs_f64() / single.p50.as_secs_f64(),
        red.p50.as_secs_f64() / quorum.p50.as_secs_f64(),
    );
}
