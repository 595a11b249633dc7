//! Counting semaphores on RedisStore against the floor (two `PING`s on the same client stack)
//! and Symfony Semaphore 5.4 (php, phpredis) on one throwaway redis-server, in interleaved
//! rounds: the uncontended cycle (acquire + release of one permit, limit 4), the hand-off to a
//! parked waiter when a permit frees (ours: woken by the release; Symfony's: polling), and the
//! commands a parked waiter sends per second.
//!
//! `cargo run --release -p xtr-lock-bench --bin redis-semaphore-bench` prints a Markdown table;
//! run it under `taskset -c 0` too for the other placement (everything on one vCPU).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use xtr_lock::{LockFactory, RedisStore, Semaphore};
use xtr_lock_bench::{
    Summary, cell, handoffs_to_peer, lock_cycles, lock_handoffs, park, peer_script, php_summary,
};
use xtr_lock_testkit::redis::RedisServer;

const ROUNDS: usize = 5;
const CYCLES: usize = 1_000;
const PHP_CYCLES: usize = 1_000;
const HANDOFFS: usize = 40;
const PHP_HANDOFFS: usize = 10;
const PARKED: usize = 8;
const PARKED_FOR: Duration = Duration::from_secs(3);
const LIMIT: u32 = 4;
const TTL: Duration = Duration::from_secs(30);

fn main() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let port = server.port().to_string();
    let (mut ours, mut pings, mut php, mut locks) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let sem = semaphore(&store(&server), "bench:sem-cycle", 1);
    let lock = LockFactory::new(store(&server))
        .with_ttl(Some(TTL))
        .create_lock("bench:lock-cycle");
    let mut script_us = Vec::new();
    let mut conn = rt
        .block_on(ConnectionManager::new(
            redis::Client::open(server.url(0)).unwrap(),
        ))
        .unwrap();
    for _ in 0..ROUNDS {
        server.cli(&["CONFIG", "RESETSTAT"]);
        ours.push(rt.block_on(lock_cycles(sem.as_lock(), 100, CYCLES)));
        script_us.push(evalsha_usec_per_call(&server));
        locks.push(rt.block_on(lock_cycles(&lock, 100, CYCLES)));
        pings.push(rt.block_on(ping_pairs(&mut conn, CYCLES)));
        php.push(php_summary(
            "symfony_semaphore_bench.php",
            &[
                "127.0.0.1",
                &port,
                "cycle",
                &PHP_CYCLES.to_string(),
                &LIMIT.to_string(),
            ],
        ));
    }
    let (ours, pings, php, locks) = (
        Summary::merge(&ours),
        Summary::merge(&pings),
        Summary::merge(&php),
        Summary::merge(&locks),
    );
    script_us.sort_by(f64::total_cmp);
    let script_us = script_us[script_us.len() / 2];
    let handoff = rt.block_on(handoffs(&server));
    let lock_handoff = rt.block_on(lock_handoffs(
        &LockFactory::new(store(&server)).with_ttl(Some(TTL)),
        "bench:lock-handoff",
        HANDOFFS,
    ));
    let php_handoff = rt.block_on(php_handoffs(&server));
    let per_waiter = rt.block_on(parked_commands(&server));
    let php_per_waiter = php_poll_commands(&server);

    println!(
        "| redis semaphore (limit {LIMIT}), p50 (p99) | xtr-lock | Symfony Semaphore 5.4 | floor: 2 × PING |"
    );
    println!("|---|---|---|---|");
    println!(
        "| acquire + release of one permit | {} | {} | {} |",
        cell(&ours),
        cell(&php),
        cell(&pings)
    );
    println!(
        "| (our lock's acquire + release, same rounds) | {} | | |",
        cell(&locks)
    );
    println!(
        "| hand-off to a parked waiter when a permit frees | {} (woken) | {} (polling) | |",
        cell(&handoff),
        cell(&php_handoff)
    );
    println!(
        "| (our lock's hand-off, same run) | {} | | |",
        cell(&lock_handoff)
    );
    println!(
        "| commands per second per parked waiter | {per_waiter:.2} ({PARKED} waiters) | {php_per_waiter:.1} | |"
    );
    println!();
    println!(
        "Ratios (p50): our cycle = {:.2}× two PINGs (target ≤ 1.5×), {:.2}× Symfony's cycle, \
         {:.2}× our lock's; our scripts take {script_us:.1} µs of server time each (median of \
         the rounds, INFO commandstats); our hand-off = {:.2}× our uncontended cycle (target ≤ 2×), Symfony's polling hand-off = \
         {:.0}× ours. Samples: {ROUNDS} interleaved rounds of {CYCLES} cycles (ours, PINGs) and \
         {PHP_CYCLES} (php); {HANDOFFS} and {PHP_HANDOFFS} hand-offs.",
        ratio(ours.p50, pings.p50),
        ratio(ours.p50, php.p50),
        ratio(ours.p50, locks.p50),
        ratio(handoff.p50, ours.p50),
        ratio(php_handoff.p50, handoff.p50),
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

fn store(server: &RedisServer) -> RedisStore {
    RedisStore::from_dsn(&server.url(0)).unwrap()
}

fn semaphore(store: &RedisStore, resource: &str, permits: u32) -> Semaphore {
    LockFactory::new(store.clone())
        .with_ttl(Some(TTL))
        .create_semaphore(resource, LIMIT)
        .unwrap()
        .permits(permits)
        .unwrap()
}

/// Two `PING`s in a row on a connection manager (the client our store uses), per sample.
async fn ping_pairs(conn: &mut ConnectionManager, n: usize) -> Summary {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        for _ in 0..2 {
            let _: String = redis::cmd("PING").query_async(conn).await.unwrap();
        }
        samples.push(t.elapsed());
    }
    Summary::of(samples)
}

/// Three permits stay held; a fourth holder releases [`park`]`(i)` after a waiter (on another
/// store instance, as in another process) parked; the sample is release → the waiter holds.
async fn handoffs(server: &RedisServer) -> Summary {
    let (holders, waiters) = (store(server), store(server));
    let resource = "bench:sem-handoff";
    let rest = semaphore(&holders, resource, LIMIT - 1);
    rest.acquire().await.unwrap();
    let holder = semaphore(&holders, resource, 1);
    let mut samples = Vec::with_capacity(HANDOFFS);
    for i in 0..HANDOFFS {
        holder.acquire().await.unwrap();
        let waiter = semaphore(&waiters, resource, 1);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let _ = ready_tx.send(());
            waiter.acquire().await.unwrap();
            let got = Instant::now();
            let _ = waiter.release().await.unwrap();
            got
        });
        ready_rx.await.unwrap();
        tokio::time::sleep(park(i)).await;
        let released = Instant::now();
        let _ = holder.release().await.unwrap();
        samples.push(task.await.unwrap() - released);
    }
    let _ = rest.release().await.unwrap();
    Summary::of(samples)
}

/// Our holder of every permit releases them to a Symfony waiter that polls.
async fn php_handoffs(server: &RedisServer) -> Summary {
    let resource = "bench:sem-php-handoff";
    let child = Command::new("php")
        .arg(peer_script("symfony_semaphore_bench.php"))
        .args(["127.0.0.1", &server.port().to_string(), "waiter", resource])
        .arg(LIMIT.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("php-cli");
    let holder = semaphore(&store(server), resource, LIMIT);
    Summary::of(handoffs_to_peer(holder.as_lock(), child, PHP_HANDOFFS).await)
}

/// Commands the server processed per second, since the last `CONFIG RESETSTAT`, over `for`.
fn commands_per_second(server: &RedisServer, over: Duration) -> f64 {
    let stats = server.cli(&["INFO", "stats"]);
    let total: f64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    // The INFO itself is counted.
    (total - 1.0).max(0.0) / over.as_secs_f64()
}

/// Commands per second per waiter while `PARKED` of ours wait behind a full semaphore.
async fn parked_commands(server: &RedisServer) -> f64 {
    let resource = "bench:sem-parked";
    let full = semaphore(&store(server), resource, LIMIT);
    full.acquire().await.unwrap();
    let waiters = store(server);
    let tasks: Vec<_> = (0..PARKED)
        .map(|_| {
            let s = semaphore(&waiters, resource, 1);
            tokio::spawn(async move {
                s.acquire().await.unwrap();
                let _ = s.release().await.unwrap();
            })
        })
        .collect();
    // Parked once every waiter's ticket is queued.
    let queue = waiters.internal_key(&format!("queue:{{{resource}}}:time"));
    let mut conn = ConnectionManager::new(redis::Client::open(server.url(0)).unwrap())
        .await
        .unwrap();
    loop {
        let n: usize = redis::cmd("ZCARD")
            .arg(&queue)
            .query_async(&mut conn)
            .await
            .unwrap();
        if n == PARKED {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.cli(&["CONFIG", "RESETSTAT"]);
    tokio::time::sleep(PARKED_FOR).await;
    let rate = commands_per_second(server, PARKED_FOR) / PARKED as f64;
    let _ = full.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    rate
}

/// Commands per second of one Symfony waiter polling a full semaphore.
fn php_poll_commands(server: &RedisServer) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let resource = "bench:sem-php-poll";
    let full = semaphore(&store(server), resource, LIMIT);
    rt.block_on(full.acquire()).unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let out = Command::new("php")
        .arg(peer_script("symfony_semaphore_bench.php"))
        .args(["127.0.0.1", &server.port().to_string(), "poll", resource])
        .arg(LIMIT.to_string())
        .arg(PARKED_FOR.as_secs_f64().to_string())
        .output()
        .expect("php-cli");
    assert!(out.status.success(), "{out:?}");
    let rate = commands_per_second(server, PARKED_FOR);
    let _ = rt.block_on(full.release()).unwrap();
    rate
}
