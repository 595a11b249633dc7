//! FlockStore against Python xtr-lock's FlockStore and the bare system calls, side by side in
//! one run, on one machine and one directory kind (a temp dir).
//!
//! `cargo run --release -p xtr-lock-bench --bin flock-bench` prints a Markdown table of
//! p50 (p99) latencies:
//! - uncontended acquire+release, against the floors: the `flock` pair on an open descriptor,
//!   and open + flock + unlock + close (what any holder-per-acquisition lock must do);
//! - hand-off (holder releases → waiter holds) within one process and across two processes;
//! - the cycle on a fresh resource (its lock file does not exist yet, as with per-entity names
//!   like `invoice:<id>`), against the floor of creating, locking, unlocking and closing a new
//!   file, in interleaved rounds.
//!
//! `flock-bench --fresh ROUNDS` measures only the fresh-resource cycle and its floor.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, Mode, OFlags};
use xtr_lock::Lockable as _;
use xtr_lock::{FlockStore, LockFactory};
use xtr_lock_bench::{Summary, cell, human, lock_cycles, lock_handoffs, monotonic_ns, park};

const CYCLES: usize = 20_000;
const HANDOFFS: usize = 100;
const PY_HANDOFFS: usize = 40;
/// Fresh-resource cycles (and floor cycles) per round.
const FRESH_PER_ROUND: usize = 500;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child-waiter") {
        child_waiter(Path::new(&args[2]), &args[3]);
        return;
    }
    if args.get(1).map(String::as_str) == Some("--fresh") {
        let rounds = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(10);
        let dir = tempfile::tempdir().unwrap();
        let (ours, floor) = fresh(dir.path(), rounds, false);
        print_fresh(&ours, &floor, rounds, "");
        let (ours, floor) = fresh(dir.path(), rounds, true);
        print_fresh(&ours, &floor, rounds, ", beside a held lock's monitor");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    eprintln!("directory: {}", dir.path().display());

    let pair = flock_pair(dir.path());
    let open_cycle = open_flock_close(dir.path());
    let ours_cycle = rt.block_on(uncontended(dir.path()));
    let ours_in = rt.block_on(handoff_in_process(dir.path()));
    let ours_x = handoff_across_processes(dir.path());
    let py = python(dir.path());
    let (fresh_ours, fresh_floor) = fresh(dir.path(), 10, false);

    println!("| flock store, p50 (p99) | xtr-lock (Rust) | Python xtr-lock 4.1.0 | floor |");
    println!("|---|---|---|---|");
    println!(
        "| uncontended acquire + release | {} | {} | flock pair {}; open+flock+unlock+close {} |",
        cell(&ours_cycle),
        cell(&py.cycle),
        cell(&pair),
        cell(&open_cycle)
    );
    println!(
        "| hand-off, same process | {} | {} | — |",
        cell(&ours_in),
        cell(&py.handoff_in)
    );
    println!(
        "| hand-off, across processes | {} | {} | — |",
        cell(&ours_x),
        cell(&py.handoff_x)
    );
    println!(
        "| acquire + release of a fresh resource (new lock file) | {} | — | create+flock+unlock+close {} |",
        cell(&fresh_ours),
        cell(&fresh_floor)
    );
    println!();
    println!(
        "Ratios (p50): fresh-resource cycle = {:.2}× its floor.",
        ratio(fresh_ours.p50, fresh_floor.p50)
    );
    println!(
        "Ratios (p50): uncontended cycle = {:.2}× the flock pair, {:.2}× open+flock+close; \
         Python's cycle = {:.1}× ours; hand-off in process {:.0}× faster than Python, across \
         processes {:.0}× faster. Samples: {CYCLES} cycles, {HANDOFFS} Rust and {PY_HANDOFFS} \
         Python hand-offs.",
        ratio(ours_cycle.p50, pair.p50),
        ratio(ours_cycle.p50, open_cycle.p50),
        ratio(py.cycle.p50, ours_cycle.p50),
        ratio(py.handoff_in.p50, ours_in.p50),
        ratio(py.handoff_x.p50, ours_x.p50),
    );
    eprintln!(
        "(p50s: pair {}, open cycle {}, ours {})",
        human(pair.p50),
        human(open_cycle.p50),
        human(ours_cycle.p50)
    );
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

fn open_file(path: &Path) -> OwnedFd {
    rustix::fs::open(
        path,
        OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o666),
    )
    .unwrap()
}

/// The floor: LOCK_EX|LOCK_NB then LOCK_UN on a descriptor kept open.
fn flock_pair(dir: &Path) -> Summary {
    let fd = open_file(&dir.join("floor.lock"));
    let mut samples = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let t = Instant::now();
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).unwrap();
        rustix::fs::flock(&fd, FlockOperation::NonBlockingUnlock).unwrap();
        samples.push(t.elapsed());
    }
    Summary::of(samples)
}

/// What a lock that opens a descriptor per acquisition must at least do.
fn open_flock_close(dir: &Path) -> Summary {
    let path = dir.join("floor-open.lock");
    let mut samples = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let t = Instant::now();
        let fd = open_file(&path);
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).unwrap();
        rustix::fs::flock(&fd, FlockOperation::NonBlockingUnlock).unwrap();
        drop(fd);
        samples.push(t.elapsed());
    }
    Summary::of(samples)
}

/// The fresh-resource cycle and its floor, `rounds` rounds of [`FRESH_PER_ROUND`] each, the
/// order reversed every other round; every cycle on a name never used before. With `monitored`,
/// another lock of the process is held meanwhile with its monitor running (a job holding a
/// lock while it takes per-entity ones), from a second before the first round.
fn fresh(dir: &Path, rounds: usize, monitored: bool) -> (Summary, Summary) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let factory = LockFactory::new(FlockStore::in_dir(dir).unwrap());
    let held = factory.create_lock("bench:held");
    let _monitor = monitored.then(|| {
        rt.block_on(async {
            assert!(held.try_acquire().await.unwrap());
            let monitor = held.keep_alive().unwrap();
            tokio::time::sleep(Duration::from_millis(1100)).await;
            monitor
        })
    });
    // Names never used before, in this run's other calls either.
    let tag = if monitored { "m" } else { "" };
    let floor_dir = dir.join(format!("floor-fresh{tag}"));
    std::fs::create_dir_all(&floor_dir).unwrap();
    let (mut ours, mut floor) = (Vec::new(), Vec::new());
    let mut n = 0usize;
    let ours_round = |n: &mut usize, out: &mut Vec<Duration>| {
        for _ in 0..FRESH_PER_ROUND {
            *n += 1;
            let lock = factory.create_lock(format!("invoice:{tag}{n}"));
            let t = Instant::now();
            assert!(rt.block_on(lock.try_acquire()).unwrap());
            let _ = rt.block_on(lock.release()).unwrap();
            out.push(t.elapsed());
        }
    };
    let floor_round = |n: &mut usize, out: &mut Vec<Duration>| {
        for _ in 0..FRESH_PER_ROUND {
            *n += 1;
            let path = floor_dir.join(format!("invoice-{n}.lock"));
            let t = Instant::now();
            let fd = rustix::fs::open(
                &path,
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::from_raw_mode(0o666),
            )
            .unwrap();
            rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).unwrap();
            rustix::fs::flock(&fd, FlockOperation::NonBlockingUnlock).unwrap();
            drop(fd);
            out.push(t.elapsed());
        }
    };
    for round in 0..rounds {
        if round % 2 == 0 {
            ours_round(&mut n, &mut ours);
            floor_round(&mut n, &mut floor);
        } else {
            floor_round(&mut n, &mut floor);
            ours_round(&mut n, &mut ours);
        }
    }
    (Summary::of(ours), Summary::of(floor))
}

fn print_fresh(ours: &Summary, floor: &Summary, rounds: usize, beside: &str) {
    println!("| fresh resource, p50 (p99) | time |");
    println!("|---|---|");
    println!(
        "| flock store: acquire + release, new lock file{beside} | {} |",
        cell(ours)
    );
    println!(
        "| floor: create + flock + unlock + close a new file | {} |",
        cell(floor)
    );
    println!();
    println!(
        "Ratio (p50): {:.2}× the floor; {} cycles of each in {rounds} interleaved rounds.",
        ratio(ours.p50, floor.p50),
        rounds * FRESH_PER_ROUND
    );
}

async fn uncontended(dir: &Path) -> Summary {
    let factory = LockFactory::new(FlockStore::in_dir(dir).unwrap());
    lock_cycles(&factory.create_lock("bench:uncontended"), 0, CYCLES).await
}

async fn handoff_in_process(dir: &Path) -> Summary {
    let factory = LockFactory::new(FlockStore::in_dir(dir).unwrap());
    lock_handoffs(&factory, "bench:handoff", HANDOFFS).await
}

/// The parent holds; a child process (this binary) waits; the hand-off is measured on
/// CLOCK_MONOTONIC, which both processes share.
fn handoff_across_processes(dir: &Path) -> Summary {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("child-waiter")
        .arg(dir)
        .arg("bench:xproc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = BufReader::new(child.stdout.take().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let factory = LockFactory::new(FlockStore::in_dir(dir).unwrap());
    let holder = factory.create_lock("bench:xproc");
    let mut samples = Vec::with_capacity(HANDOFFS);
    let mut line = String::new();
    for i in 0..HANDOFFS {
        rt.block_on(holder.acquire()).unwrap();
        writeln!(to_child, "go").unwrap();
        line.clear();
        from_child.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "waiting");
        std::thread::sleep(park(i)); // the child is parked in its wait
        let released = monotonic_ns();
        let _ = rt.block_on(holder.release()).unwrap();
        line.clear();
        from_child.read_line(&mut line).unwrap();
        let got: u64 = line.trim().parse().unwrap();
        samples.push(Duration::from_nanos(got.saturating_sub(released)));
    }
    drop(to_child);
    child.wait().unwrap();
    Summary::of(samples)
}

fn child_waiter(dir: &Path, resource: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let factory = LockFactory::new(FlockStore::in_dir(dir).unwrap());
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        if line.unwrap() != "go" {
            break;
        }
        let waiter = factory.create_lock(resource);
        writeln!(out, "waiting").unwrap();
        out.flush().unwrap();
        rt.block_on(waiter.acquire()).unwrap();
        let got = monotonic_ns();
        let _ = rt.block_on(waiter.release()).unwrap();
        writeln!(out, "{got}").unwrap();
        out.flush().unwrap();
    }
}

struct Python {
    cycle: Summary,
    handoff_in: Summary,
    handoff_x: Summary,
}

fn python(dir: &Path) -> Python {
    let v = xtr_lock_bench::run_python(
        "flock_bench.py",
        &[
            dir.display().to_string(),
            CYCLES.to_string(),
            PY_HANDOFFS.to_string(),
        ],
    );
    Python {
        cycle: Summary::from_json(&v["cycle"]),
        handoff_in: Summary::from_json(&v["handoff_in"]),
        handoff_x: Summary::from_json(&v["handoff_x"]),
    }
}
