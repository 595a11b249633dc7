//! `xtr-lock run r -- true` against `flock FILE true` (util-linux), wall time per invocation,
//! side by side in one run on the same directory.
//!
//! `cargo build --release -p xtr-lock-cli && cargo run --release -p xtr-lock-bench --bin cli-bench`
//! (the `xtr-lock` binary is looked up next to this one, or in `$XTR_LOCK_BIN`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xtr_lock_bench::{Summary, cell};

const RUNS: usize = 300;

fn time(mut cmd: impl FnMut() -> Command) -> Summary {
    let mut samples = Vec::with_capacity(RUNS);
    for _ in 0..RUNS + 10 {
        let mut c = cmd();
        c.stdout(Stdio::null()).stderr(Stdio::null());
        let t = Instant::now();
        let status = c.status().expect("spawn");
        samples.push(t.elapsed());
        assert!(status.success(), "{c:?} failed");
    }
    samples.drain(..10); // warm-up: page cache, dynamic loader
    Summary::of(samples)
}

fn main() {
    let xtr: PathBuf = std::env::var_os("XTR_LOCK_BIN").map_or_else(
        || std::env::current_exe().unwrap().with_file_name("xtr-lock"),
        PathBuf::from,
    );
    assert!(
        xtr.exists(),
        "{} is missing: cargo build --release -p xtr-lock-cli first",
        xtr.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let dsn = format!("flock://{}", dir.path().display());
    let file = dir.path().join("flock1.lock");
    let true_bin = "/bin/true";
    let bare = time(|| Command::new(true_bin));
    let flock1 = time(|| {
        let mut c = Command::new("flock");
        c.arg(&file).arg(true_bin);
        c
    });
    let ours = time(|| {
        let mut c = Command::new(&xtr);
        c.args(["run", "--store", &dsn, "r", "--", true_bin]);
        c
    });
    println!("| `… true`, wall time per run, p50 (p99) | time |");
    println!("|---|---|");
    println!(
        "| `xtr-lock run --store flock://DIR r -- true` | {} |",
        cell(&ours)
    );
    println!("| `flock FILE true` (util-linux) | {} |", cell(&flock1));
    println!("| `true` alone | {} |", cell(&bare));
    println!();
    let r = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "Ratio (p50): xtr-lock run = {:.2}× flock(1); {RUNS} runs each.",
        r(ours.p50, flock1.p50)
    );
}
