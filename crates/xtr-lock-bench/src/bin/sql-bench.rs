//! The SQL table store against Symfony Lock's `PdoStore` (php) and the floor (one `SELECT 1`
//! round trip on a pooled connection of the same driver), side by side on throwaway PostgreSQL
//! and MariaDB servers (and a SQLite file, Rust only), in interleaved rounds.
//!
//! `cargo run --release -p xtr-lock-bench --bin sql-bench` prints a Markdown table; run it under
//! `taskset -c 0` too for the other placement (everything on one vCPU).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, SqlStore};
use xtr_lock_bench::{
    Summary, cell, handoffs_between, handoffs_to_peer, human, peer_script, php_summary,
};
use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::postgres::PostgresServer;

const ROUNDS: usize = 3;
const CYCLES: usize = 300;
const PHP_CYCLES: usize = 100;
const HANDOFFS: usize = 20;
const PHP_HANDOFFS: usize = 8;
const THROUGHPUT: Duration = Duration::from_secs(3);

struct Target {
    name: &'static str,
    dsn: String,
    /// Symfony's PDO DSN and user, where Symfony runs.
    pdo: Option<(String, &'static str)>,
}

fn main() {
    let pg = PostgresServer::start();
    let my = MariaDbServer::start();
    let dir = tempfile::tempdir().unwrap();
    let targets = [
        Target {
            name: "PostgreSQL 15",
            dsn: format!("{}?create_table=true", pg.url()),
            pdo: Some((
                format!(
                    "pgsql:host=127.0.0.1;port={};dbname=postgres;sslmode=disable",
                    pg.port()
                ),
                "postgres",
            )),
        },
        Target {
            name: "MariaDB 10.11",
            dsn: format!("{}?create_table=true", my.url()),
            pdo: Some((
                format!("mysql:host=127.0.0.1;port={};dbname=xtr", my.port()),
                "root",
            )),
        },
        Target {
            name: "SQLite (file)",
            dsn: format!(
                "sqlite://{}?create_table=true",
                dir.path().join("locks.db").display()
            ),
            pdo: None,
        },
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("| database | what | xtr-lock | Symfony PdoStore | floor: `SELECT 1` |");
    println!("|---|---|---|---|---|");
    for t in &targets {
        let r = rt.block_on(measure(t));
        let php = |s: &Option<Summary>| s.as_ref().map_or("—".to_owned(), cell);
        println!(
            "| {} | acquire + release, p50 (p99) | {} | {} | {} (×2 = {}) |",
            t.name,
            cell(&r.cycle),
            php(&r.php_cycle),
            cell(&r.floor),
            human(r.floor.p50 * 2),
        );
        println!(
            "| {} | cycle ÷ two `SELECT 1` | {:.2}× | {} | 1× |",
            t.name,
            r.cycle.p50.as_secs_f64() / (2.0 * r.floor.p50.as_secs_f64()),
            r.php_cycle.as_ref().map_or("—".to_owned(), |p| format!(
                "{:.2}×",
                p.p50.as_secs_f64() / (2.0 * r.floor.p50.as_secs_f64())
            )),
        );
        println!(
            "| {} | hand-off within one store (woken in-process): release → waiter holds, p50 (p99) | {} | | |",
            t.name,
            cell(&r.local_handoff),
        );
        println!(
            "| {} | hand-off, another process's store: release → waiter holds, p50 (p99) | {} | {} | |",
            t.name,
            cell(&r.handoff),
            php(&r.php_handoff),
        );
        println!(
            "| {} | 16 tasks × 16 resources, acquisitions/s | {:.0} | {} | |",
            t.name,
            r.throughput,
            r.php_throughput
                .map_or("—".to_owned(), |n| format!("{n:.0} (4 processes)")),
        );
    }
}

struct Measured {
    cycle: Summary,
    floor: Summary,
    handoff: Summary,
    local_handoff: Summary,
    throughput: f64,
    php_cycle: Option<Summary>,
    php_handoff: Option<Summary>,
    php_throughput: Option<f64>,
}

async fn measure(t: &Target) -> Measured {
    eprintln!("{}", t.name);
    let store = SqlStore::from_dsn(&t.dsn).unwrap();
    store.create_table().await.unwrap();
    let factory = LockFactory::new(store).with_ttl(Some(Duration::from_secs(30)));
    let floor_pool = floor_pool(&t.dsn).await;
    let (mut cycle, mut floor, mut handoff, mut php_cycle, mut php_handoff) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut local = vec![];
    let lock = factory.create_lock("bench:cycle");
    for _ in 0..50 {
        assert!(lock.try_acquire().await.unwrap());
        let _ = lock.release().await.unwrap();
    }
    for round in 0..ROUNDS {
        eprintln!("  round {}/{ROUNDS}", round + 1);
        for _ in 0..CYCLES {
            let t0 = Instant::now();
            assert!(lock.try_acquire().await.unwrap());
            let _ = lock.release().await.unwrap();
            cycle.push(t0.elapsed());
            let t0 = Instant::now();
            select_one(&floor_pool).await;
            floor.push(t0.elapsed());
        }
        // The waiter's store is another instance (as in another process): on PostgreSQL it is
        // woken by NOTIFY through its listener, elsewhere by polling.
        let other = LockFactory::new(SqlStore::from_dsn(&t.dsn).unwrap())
            .with_ttl(Some(Duration::from_secs(30)));
        handoff.extend(handoffs_between(&factory, &other, "bench:handoff", HANDOFFS).await);
        local.extend(handoffs_between(&factory, &factory, "bench:handoff", HANDOFFS).await);
        if let Some((pdo, user)) = &t.pdo {
            let s = run_php(&[pdo, user, "cycle", &PHP_CYCLES.to_string()]);
            php_cycle.push(s);
            php_handoff.extend(symfony_handoffs(&factory, pdo, user).await);
        }
    }
    let throughput = rust_throughput(&factory).await;
    let php_throughput = t.pdo.as_ref().map(|(pdo, user)| php_throughput(pdo, user));
    Measured {
        cycle: Summary::of(cycle),
        floor: Summary::of(floor),
        handoff: Summary::of(handoff),
        local_handoff: Summary::of(local),
        throughput,
        php_cycle: (!php_cycle.is_empty()).then(|| Summary::merge(&php_cycle)),
        php_handoff: (!php_handoff.is_empty()).then(|| Summary::of(php_handoff)),
        php_throughput,
    }
}

enum Floor {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
    Lite(sqlx::SqlitePool),
}

/// A pool of the same driver without a ping before each use, as the store's: one `SELECT 1` is
/// one round trip.
async fn floor_pool(dsn: &str) -> Floor {
    let base = dsn.split('?').next().unwrap();
    if base.starts_with("postgres") {
        Floor::Pg(
            sqlx::postgres::PgPoolOptions::new()
                .test_before_acquire(false)
                .connect(base)
                .await
                .unwrap(),
        )
    } else if base.starts_with("mysql") {
        Floor::My(
            sqlx::mysql::MySqlPoolOptions::new()
                .test_before_acquire(false)
                .connect(base)
                .await
                .unwrap(),
        )
    } else {
        Floor::Lite(
            sqlx::sqlite::SqlitePoolOptions::new()
                .test_before_acquire(false)
                .connect(base)
                .await
                .unwrap(),
        )
    }
}

async fn select_one(pool: &Floor) {
    let q = "SELECT 1";
    match pool {
        Floor::Pg(p) => drop(sqlx::query(q).execute(p).await.unwrap()),
        Floor::My(p) => drop(sqlx::query(q).execute(p).await.unwrap()),
        Floor::Lite(p) => drop(sqlx::query(q).execute(p).await.unwrap()),
    }
}

/// A Symfony waiter (php, polling every 100 ms) behind our holder.
async fn symfony_handoffs(factory: &LockFactory, pdo: &str, user: &str) -> Vec<Duration> {
    let resource = "bench:php-handoff";
    let child = Command::new("php")
        .arg(peer_script("symfony_sql_bench.php"))
        .args([pdo, user, "waiter", resource])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("php-cli");
    let holder = factory.create_lock(resource);
    handoffs_to_peer(&holder, child, PHP_HANDOFFS).await
}

async fn rust_throughput(factory: &LockFactory) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + THROUGHPUT;
    let mut tasks = Vec::new();
    for t in 0..16u64 {
        let (factory, done) = (factory.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while Instant::now() < end {
                let lock = factory.create_lock(format!("bench:tp:{}", i % 16));
                lock.acquire().await.unwrap();
                let _ = lock.release().await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
                i = i
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407)
                    >> 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / THROUGHPUT.as_secs_f64()
}

fn php_throughput(pdo: &str, user: &str) -> f64 {
    let secs = THROUGHPUT.as_secs().to_string();
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new("php")
                .arg(peer_script("symfony_sql_bench.php"))
                .args([pdo, user, "loop", &secs, "16"])
                .stdout(Stdio::piped())
                .spawn()
                .expect("php-cli")
        })
        .collect();
    let mut n = 0.0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        n += v["n"].as_f64().unwrap();
    }
    n / THROUGHPUT.as_secs_f64()
}

fn run_php(args: &[&str]) -> Summary {
    php_summary("symfony_sql_bench.php", args)
}
