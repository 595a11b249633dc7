//! The database session-lock stores against Symfony Lock's `PostgreSqlStore` (php) and the
//! floor (two `SELECT 1` round trips on one connection: a lock and an unlock statement are one
//! round trip each), side by side on throwaway PostgreSQL and MariaDB servers, in interleaved
//! rounds.
//!
//! `cargo run --release -p xtr-lock-bench --bin advisory-bench` prints a Markdown table; run it
//! under `taskset -c 0` too for the other placement (everything on one vCPU).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection as _;
use xtr_lock::{LockFactory, Lockable as _, MySqlLockStore, PgAdvisoryStore};
use xtr_lock_bench::{
    Summary, cell, handoffs_between, handoffs_to_peer, human, peer_script, php_summary,
};
use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::postgres::PostgresServer;

const ROUNDS: usize = 3;
const CYCLES: usize = 300;
const PHP_CYCLES: usize = 300;
const HANDOFFS: usize = 20;
const PHP_HANDOFFS: usize = 10;

fn main() {
    let pg = PostgresServer::start();
    let my = MariaDbServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pg_dsn = format!(
        "postgresql+advisory{}",
        pg.url().strip_prefix("postgres").unwrap()
    );
    let symfony = format!(
        "pgsql+advisory:host=127.0.0.1;port={};dbname=postgres;user=postgres;sslmode=disable",
        pg.port()
    );
    let my_dsn = format!("mysql+getlock{}", my.url().strip_prefix("mysql").unwrap());
    let p = rt.block_on(postgres(&pg, &pg_dsn, &symfony));
    let m = rt.block_on(mariadb(&my, &my_dsn));
    println!("| what | xtr-lock | Symfony PostgreSqlStore | floor: two `SELECT 1` |");
    println!("|---|---|---|---|");
    println!(
        "| PostgreSQL advisory: acquire + release, p50 (p99) | {} | {} | {} |",
        cell(&p.cycle),
        cell(&p.php_cycle),
        cell(&p.floor),
    );
    println!(
        "| ÷ floor (p50) | {:.2}× | {:.2}× | |",
        ratio(p.cycle.p50, p.floor.p50),
        ratio(p.php_cycle.p50, p.floor.p50),
    );
    println!(
        "| PostgreSQL advisory: hand-off, another store instance (native wait), p50 (p99) | {} | | |",
        cell(&p.handoff),
    );
    println!(
        "| PostgreSQL advisory: hand-off, xtr-lock holder → Symfony waiter (native wait), p50 (p99) | | {} | |",
        cell(&p.php_handoff),
    );
    println!(
        "| MariaDB `GET_LOCK`: acquire + release, p50 (p99) | {} | — | {} |",
        cell(&m.cycle),
        cell(&m.floor),
    );
    println!(
        "| ÷ floor (p50) | {:.2}× | | |",
        ratio(m.cycle.p50, m.floor.p50),
    );
    println!(
        "| MariaDB `GET_LOCK`: hand-off, another store instance (native wait), p50 (p99) | {} | | |",
        cell(&m.handoff),
    );
    eprintln!(
        "floor p50: PostgreSQL {}, MariaDB {}",
        human(p.floor.p50),
        human(m.floor.p50)
    );
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

struct Measured {
    cycle: Summary,
    floor: Summary,
    handoff: Summary,
    php_cycle: Summary,
    php_handoff: Summary,
}

/// The floor's connection: one session, as the lock statements have.
enum FloorConn {
    Pg(sqlx::PgConnection),
    My(sqlx::MySqlConnection),
}

impl FloorConn {
    /// Two `SELECT 1` round trips: what a lock and an unlock statement cost at least.
    async fn two_selects(&mut self) {
        for _ in 0..2 {
            match self {
                FloorConn::Pg(c) => drop(sqlx::query("SELECT 1").execute(&mut *c).await.unwrap()),
                FloorConn::My(c) => drop(sqlx::query("SELECT 1").execute(&mut *c).await.unwrap()),
            }
        }
    }
}

/// Cycles of `lock` and of the floor, interleaved one by one.
async fn cycles_against(
    lock: &xtr_lock::Lock,
    floor: &mut FloorConn,
    cycle: &mut Vec<Duration>,
    floor_samples: &mut Vec<Duration>,
) {
    for _ in 0..CYCLES {
        let t0 = Instant::now();
        assert!(lock.try_acquire().await.unwrap());
        let _ = lock.release().await.unwrap();
        cycle.push(t0.elapsed());
        let t0 = Instant::now();
        floor.two_selects().await;
        floor_samples.push(t0.elapsed());
    }
}

async fn postgres(server: &PostgresServer, dsn: &str, symfony: &str) -> Measured {
    eprintln!("PostgreSQL");
    let factory = LockFactory::new(PgAdvisoryStore::from_dsn(dsn).unwrap());
    let other = LockFactory::new(PgAdvisoryStore::from_dsn(dsn).unwrap());
    let crc = LockFactory::new(PgAdvisoryStore::from_dsn(&format!("{dsn}?keys=crc32")).unwrap());
    let mut conn = FloorConn::Pg(sqlx::PgConnection::connect(&server.url()).await.unwrap());
    let lock = factory.create_lock("bench:cycle");
    warm(&lock).await;
    let (mut cycle, mut floor, mut handoff, mut php_cycle, mut php_handoff) =
        (vec![], vec![], vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        eprintln!("  round {}/{ROUNDS}", round + 1);
        cycles_against(&lock, &mut conn, &mut cycle, &mut floor).await;
        php_cycle.push(run_php(&[symfony, "cycle", &PHP_CYCLES.to_string()]));
        handoff.extend(handoffs_between(&factory, &other, "bench:handoff", HANDOFFS).await);
        php_handoff.extend(symfony_handoffs(&crc, symfony).await);
    }
    Measured {
        cycle: Summary::of(cycle),
        floor: Summary::of(floor),
        handoff: Summary::of(handoff),
        php_cycle: Summary::merge(&php_cycle),
        php_handoff: Summary::of(php_handoff),
    }
}

struct MyMeasured {
    cycle: Summary,
    floor: Summary,
    handoff: Summary,
}

async fn mariadb(server: &MariaDbServer, dsn: &str) -> MyMeasured {
    eprintln!("MariaDB");
    let factory = LockFactory::new(MySqlLockStore::from_dsn(dsn).unwrap());
    let other = LockFactory::new(MySqlLockStore::from_dsn(dsn).unwrap());
    let mut conn = FloorConn::My(sqlx::MySqlConnection::connect(&server.url()).await.unwrap());
    let lock = factory.create_lock("bench:cycle");
    warm(&lock).await;
    let (mut cycle, mut floor, mut handoff) = (vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        eprintln!("  round {}/{ROUNDS}", round + 1);
        cycles_against(&lock, &mut conn, &mut cycle, &mut floor).await;
        handoff.extend(handoffs_between(&factory, &other, "bench:handoff", HANDOFFS).await);
    }
    MyMeasured {
        cycle: Summary::of(cycle),
        floor: Summary::of(floor),
        handoff: Summary::of(handoff),
    }
}

async fn warm(lock: &xtr_lock::Lock) {
    for _ in 0..50 {
        assert!(lock.try_acquire().await.unwrap());
        let _ = lock.release().await.unwrap();
    }
}

/// A Symfony waiter (php, blocked in `pg_advisory_lock`) behind our holder in crc32 mode.
async fn symfony_handoffs(factory: &LockFactory, symfony: &str) -> Vec<Duration> {
    let resource = "bench:php-handoff";
    let child = Command::new("php")
        .arg(peer_script("symfony_advisory_bench.php"))
        .args([symfony, "waiter", resource])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("php-cli");
    let holder = factory.create_lock(resource);
    handoffs_to_peer(&holder, child, PHP_HANDOFFS).await
}

fn run_php(args: &[&str]) -> Summary {
    php_summary("symfony_advisory_bench.php", args)
}
