//! Counting semaphores on one machine, side by side in interleaved rounds: the flock store's
//! slot cycle (acquire + release of one permit of 4, portalocker's slot files) against
//! portalocker 4.4.2's own `NamedBoundedSemaphore` cycle on the same kind of directory, and the
//! SysV store's cycle (one atomic `semop` each way).
//!
//! `cargo run --release -p xtr-lock-bench --bin semaphore-bench` prints a Markdown table of the
//! medians of the round p50s (and the worst round p99). Run it under `taskset -c 0` too for the
//! other placement (every process on one vCPU).

use std::path::Path;

use xtr_lock::{FlockStore, LockFactory, SemaphoreStore};
use xtr_lock_bench::{Summary, cell, lock_cycles};

const ROUNDS: usize = 6;
const CYCLES: usize = 5_000;
const LIMIT: u32 = 4;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut flock, mut python, mut sysv) = (Vec::new(), Vec::new(), Vec::new());
    let sysv_name = format!("bench:sysv-semaphore:{}", std::process::id());
    for round in 0..ROUNDS {
        // A B C, then C B A: neither side always runs first.
        let mut steps: Vec<u8> = vec![0, 1, 2];
        if round % 2 == 1 {
            steps.reverse();
        }
        for step in steps {
            match step {
                0 => flock.push(rt.block_on(flock_cycle(dir.path()))),
                1 => python.push(portalocker_cycle(dir.path())),
                _ => sysv.push(rt.block_on(sysv_cycle(&sysv_name))),
            }
        }
    }
    // Counting sets stay until removed: this run's goes now.
    let key = xtr_lock::store::counting_semaphore_key(&sysv_name);
    let _ = std::process::Command::new("ipcrm")
        .args(["-S", &format!("{:#x}", key as u32)])
        .status();
    let (flock, python, sysv) = (
        Summary::merge(&flock),
        Summary::merge(&python),
        Summary::merge(&sysv),
    );
    println!("| semaphore cycle (1 permit of {LIMIT}), p50 (worst round p99) | time |");
    println!("|---|---|");
    println!(
        "| flock store (portalocker's slot files) | {} |",
        cell(&flock)
    );
    println!(
        "| portalocker 4.4.2 NamedBoundedSemaphore (Python) | {} |",
        cell(&python)
    );
    println!("| SysV store (semop with SEM_UNDO) | {} |", cell(&sysv));
    println!();
    println!(
        "Ratios of p50s: flock cycle ÷ portalocker's = {:.2}; SysV cycle ÷ flock cycle = {:.2}. \
         {ROUNDS} interleaved rounds of {CYCLES} cycles each.",
        flock.p50.as_secs_f64() / python.p50.as_secs_f64(),
        sysv.p50.as_secs_f64() / flock.p50.as_secs_f64(),
    );
}

async fn flock_cycle(dir: &Path) -> Summary {
    let factory = LockFactory::new(FlockStore::in_dir(dir).unwrap());
    let s = factory.create_semaphore("bench-rust", LIMIT).unwrap();
    lock_cycles(s.as_lock(), 200, CYCLES).await
}

fn portalocker_cycle(dir: &Path) -> Summary {
    Summary::from_json(&xtr_lock_bench::run_python(
        "semaphore_bench.py",
        &[
            dir.display().to_string(),
            "bench-python".to_owned(),
            LIMIT.to_string(),
            CYCLES.to_string(),
        ],
    ))
}

async fn sysv_cycle(name: &str) -> Summary {
    let factory = LockFactory::new(SemaphoreStore::new());
    let s = factory.create_semaphore(name, LIMIT).unwrap();
    lock_cycles(s.as_lock(), 200, CYCLES).await
}
