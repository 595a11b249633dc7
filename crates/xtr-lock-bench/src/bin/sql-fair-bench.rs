//! What the SQL table store's fair queue costs an uncontended holder: acquire + release on a
//! fair store (the default) and on one opened with `?fair=false`, in interleaved rounds, on
//! throwaway MariaDB and PostgreSQL servers and a SQLite file; on MariaDB also the statements
//! per cycle (the server's `Questions` counter).
//!
//! `cargo run --release -p xtr-lock-bench --bin sql-fair-bench [mariadb|postgres|sqlite]`
//! prints a Markdown table (of the databases named, or all three).

use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, SqlStore};
use xtr_lock_bench::{Summary, cell};
use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::postgres::PostgresServer;

const ROUNDS: usize = 5;
const CYCLES: usize = 200;

fn main() {
    let my = MariaDbServer::start();
    let pg = PostgresServer::start();
    let dir = tempfile::tempdir().unwrap();
    let lite = format!("sqlite://{}", dir.path().join("locks.db").display());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| database | fair (default) | `fair=false` | fair ÷ unfair (p50) | statements per cycle (fair / unfair) |"
    );
    println!("|---|---|---|---|---|");
    let only: Vec<String> = std::env::args().skip(1).collect();
    for (name, url, server) in [
        ("MariaDB 10.11", my.url(), Some(&my)),
        ("PostgreSQL 15", pg.url(), None),
        ("SQLite (file)", lite, None),
    ] {
        let named = name.split(' ').next().unwrap().to_lowercase();
        if !only.is_empty() && !only.contains(&named) {
            continue;
        }
        let (fair, unfair, statements) = rt.block_on(measure(&url, server));
        let ratio = fair.p50.as_secs_f64() / unfair.p50.as_secs_f64();
        let statements = statements.map_or("—".to_owned(), |(f, u)| format!("{f:.2} / {u:.2}"));
        println!(
            "| {name} | {} | {} | {ratio:.2}× | {statements} |",
            cell(&fair),
            cell(&unfair)
        );
    }
}

/// The server's count of statements received so far.
fn questions(server: &MariaDbServer) -> u64 {
    let out = server.sql("SHOW GLOBAL STATUS LIKE 'Questions'");
    out.split_once('\t').unwrap().1.trim().parse().unwrap()
}

async fn measure(
    url: &str,
    server: Option<&MariaDbServer>,
) -> (Summary, Summary, Option<(f64, f64)>) {
    let fair = SqlStore::from_dsn(&format!("{url}?create_table=true")).unwrap();
    fair.create_table().await.unwrap();
    let unfair = SqlStore::from_dsn(&format!("{url}?fair=false")).unwrap();
    let ttl = Some(Duration::from_secs(30));
    let locks = [
        LockFactory::new(fair)
            .with_ttl(ttl)
            .create_lock("bench:fair"),
        LockFactory::new(unfair)
            .with_ttl(ttl)
            .create_lock("bench:unfair"),
    ];
    let mut samples = [vec![], vec![]];
    let mut counted = [0u64, 0u64];
    for lock in &locks {
        for _ in 0..50 {
            assert!(lock.try_acquire().await.unwrap());
            let _ = lock.release().await.unwrap();
        }
    }
    for round in 0..ROUNDS {
        eprintln!("{url}: round {}/{ROUNDS}", round + 1);
        // Each side goes first in every other round.
        for i in [round % 2, 1 - round % 2] {
            let lock = &locks[i];
            let before = server.map(questions);
            for _ in 0..CYCLES {
                let t0 = Instant::now();
                assert!(lock.try_acquire().await.unwrap());
                let _ = lock.release().await.unwrap();
                samples[i].push(t0.elapsed());
            }
            if let (Some(s), Some(b)) = (server, before) {
                // Less the `SHOW GLOBAL STATUS` itself.
                counted[i] += questions(s) - b - 1;
            }
        }
    }
    let [fair, unfair] = samples;
    let per = |n: u64| n as f64 / (ROUNDS * CYCLES) as f64;
    let statements = server.map(|_| (per(counted[0]), per(counted[1])));
    (Summary::of(fair), Summary::of(unfair), statements)
}
