//! The SysV semaphore and Memcached stores against Symfony Lock 5.4's `SemaphoreStore` and
//! `MemcachedStore` (php), side by side in interleaved rounds, and Memcached against its floor
//! (two no-op round trips, `mn`, on one connection: what an acquire and a release cost at least).
//!
//! `cargo run --release -p xtr-lock-bench --bin symfony-stores-bench` prints a Markdown table;
//! run it under `taskset -c 0` too for the other placement (everything on one vCPU).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use xtr_lock::{LockFactory, Lockable as _, MemcachedStore, SemaphoreStore};
use xtr_lock_bench::{
    Summary, cell, handoffs_between, handoffs_to_peer, monotonic_ns, park, peer_script, php_summary,
};
use xtr_lock_testkit::memcached::MemcachedServer;

const ROUNDS: usize = 3;
const CYCLES: usize = 1000;
const HANDOFFS: usize = 20;
const PHP_HANDOFFS: usize = 10;

fn main() {
    let server = MemcachedServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sem = rt.block_on(measure(Side::Semaphore, None));
    let mc = rt.block_on(measure(Side::Memcached(server.url()), Some(server.port())));
    println!("| what | xtr-lock | Symfony | floor |");
    println!("|---|---|---|---|");
    for (name, m) in [("SysV semaphore", &sem), ("Memcached", &mc)] {
        let floor = m.floor.as_ref().map_or("—".to_owned(), cell);
        println!(
            "| {name}: acquire + release, p50 (p99) | {} | {} | {floor} |",
            cell(&m.cycle),
            cell(&m.php_cycle)
        );
        if let Some(f) = &m.floor {
            println!(
                "| ÷ floor (p50) | {:.2}× | {:.2}× | |",
                ratio(m.cycle.p50, f.p50),
                ratio(m.php_cycle.p50, f.p50)
            );
        }
        println!(
            "| {name}: hand-off within one store instance, p50 (p99) | {} | | |",
            cell(&m.local)
        );
        println!(
            "| {name}: hand-off to another store instance, p50 (p99) | {} | | |",
            cell(&m.handoff)
        );
        println!(
            "| {name}: hand-off, xtr-lock holder → Symfony waiter, p50 (p99) | | {} | |",
            cell(&m.to_php)
        );
        println!(
            "| {name}: hand-off, Symfony holder → xtr-lock waiter, p50 (p99) | {} | | |",
            cell(&m.from_php)
        );
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

#[derive(Clone)]
enum Side {
    Semaphore,
    Memcached(String),
}

impl Side {
    fn factory(&self) -> LockFactory {
        match self {
            Side::Semaphore => LockFactory::new(SemaphoreStore::new()),
            Side::Memcached(url) => LockFactory::new(MemcachedStore::from_dsn(url).unwrap())
                .with_ttl(Some(Duration::from_secs(30))),
        }
    }

    fn php_store(&self) -> String {
        match self {
            Side::Semaphore => "semaphore".to_owned(),
            Side::Memcached(url) => url.clone(),
        }
    }
}

struct Measured {
    cycle: Summary,
    php_cycle: Summary,
    floor: Option<Summary>,
    handoff: Summary,
    local: Summary,
    to_php: Summary,
    from_php: Summary,
}

async fn measure(side: Side, memcached_port: Option<u16>) -> Measured {
    let tag = std::process::id();
    let (factory, other) = (side.factory(), side.factory());
    let lock = factory.create_lock(format!("bench:cycle:{tag}"));
    for _ in 0..50 {
        assert!(lock.try_acquire().await.unwrap());
        let _ = lock.release().await.unwrap();
    }
    let mut floor_conn = match memcached_port {
        Some(port) => Some(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
        ),
        None => None,
    };
    let (mut cycle, mut floor, mut handoff, mut php_cycle, mut to_php, mut from_php) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut local = vec![];
    for round in 0..ROUNDS {
        eprintln!("round {}/{ROUNDS}", round + 1);
        for _ in 0..CYCLES {
            let t = Instant::now();
            assert!(lock.try_acquire().await.unwrap());
            let _ = lock.release().await.unwrap();
            cycle.push(t.elapsed());
            if let Some(conn) = floor_conn.as_mut() {
                let t = Instant::now();
                for _ in 0..2 {
                    conn.write_all(b"mn\r\n").await.unwrap();
                    let mut reply = [0u8; 4];
                    conn.read_exact(&mut reply).await.unwrap();
                }
                floor.push(t.elapsed());
            }
        }
        php_cycle.push(run_php(&[&side.php_store(), "cycle", &CYCLES.to_string()]));
        let resource = format!("bench:handoff:{tag}");
        handoff.extend(handoffs_between(&factory, &other, &resource, HANDOFFS).await);
        local.extend(handoffs_between(&factory, &factory, &resource, HANDOFFS).await);
        to_php
            .extend(to_symfony(&factory, &side.php_store(), &format!("bench:to-php:{tag}")).await);
        from_php.extend(
            from_symfony(
                &factory,
                &side.php_store(),
                &format!("bench:from-php:{tag}"),
            )
            .await,
        );
    }
    Measured {
        cycle: Summary::of(cycle),
        php_cycle: Summary::merge(&php_cycle),
        floor: (!floor.is_empty()).then(|| Summary::of(floor)),
        handoff: Summary::of(handoff),
        local: Summary::of(local),
        to_php: Summary::of(to_php),
        from_php: Summary::of(from_php),
    }
}

/// The php half in `mode`, its stdin and stdout piped.
fn php(store: &str, mode: &str, resource: &str) -> Child {
    Command::new("php")
        .arg(peer_script("symfony_stores_bench.php"))
        .args([store, mode, resource])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("php-cli")
}

/// Our holder releases [`park`]`(i)` after a Symfony waiter started waiting; release → it holds.
async fn to_symfony(factory: &LockFactory, store: &str, resource: &str) -> Vec<Duration> {
    let child = php(store, "waiter", resource);
    handoffs_to_peer(&factory.create_lock(resource), child, PHP_HANDOFFS).await
}

/// A Symfony holder releases [`park`]`(i)` after our waiter started waiting; its release (the
/// time it printed just before) → our waiter holds.
async fn from_symfony(factory: &LockFactory, store: &str, resource: &str) -> Vec<Duration> {
    let mut child = php(store, "holder", resource);
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = BufReader::new(child.stdout.take().unwrap());
    let mut samples = Vec::with_capacity(PHP_HANDOFFS);
    let mut line = String::new();
    for i in 0..PHP_HANDOFFS {
        writeln!(to_child, "go").unwrap();
        line.clear();
        from_child.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "held");
        let waiter = factory.create_lock(resource);
        let task = tokio::spawn(async move {
            waiter.acquire().await.unwrap();
            let got = monotonic_ns();
            let _ = waiter.release().await.unwrap();
            got
        });
        tokio::time::sleep(park(i)).await;
        writeln!(to_child, "release").unwrap();
        line.clear();
        from_child.read_line(&mut line).unwrap();
        let released: u64 = line.trim().parse().unwrap();
        let got = task.await.unwrap();
        samples.push(Duration::from_nanos(got.saturating_sub(released)));
    }
    drop(to_child);
    let _ = child.wait();
    samples
}

fn run_php(args: &[&str]) -> Summary {
    php_summary("symfony_stores_bench.php", args)
}
