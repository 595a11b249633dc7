//! `xtr-lock run r -- true` against `flock FILE true` (util-linux), wall time per invocation,
//! side by side in one run on the same directory.
//!
//! `cargo build --release -p xtr-lock-cli && cargo run --release -p xtr-lock-bench --bin cli-bench`
//! (the `xtr-lock` binary is looked up next to this one, or in `$XTR_LOCK_BIN`).
//!
//! `cli-bench --compare ROUNDS LABEL=XTR_LOCK[,OPTION…]…` compares builds of `xtr-lock` (each
//! named by a label; options go before the resource, as `-o`) with `flock FILE true` and `true`
//! alone as floors: ROUNDS rounds of 30 runs of each, the order reversed every other round, so
//! that drift in the machine's state falls on every side alike; then p50, p90 and p99 of all
//! runs, and the resident memory of each build's processes while its command runs (the command
//! left out). Pin it with `taskset -c 0` to see one core's worth of work, or leave it unpinned.
//! `cli-bench --compare ROUNDS --redis LABEL=…` also runs each build on `redis://` (a throwaway
//! server this starts on a free port), in the same rounds as `flock://` and the floors, so both
//! ratios to `flock(1)` come from one run.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xtr_lock_bench::{Summary, cell, human};
use xtr_lock_testkit::redis::RedisServer;

const RUNS: usize = 300;
/// Runs of each side per round in `--compare`.
const PER_ROUND: usize = 30;

fn time(mut cmd: impl FnMut() -> Command) -> Summary {
    let mut samples = Vec::with_capacity(RUNS);
    for _ in 0..RUNS + 10 {
        samples.push(once(&mut cmd()));
    }
    samples.drain(..10); // warm-up: page cache, dynamic loader
    Summary::of(samples)
}

/// One run of `c`, to its exit: the wall time.
fn once(c: &mut Command) -> Duration {
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let t = Instant::now();
    let status = c.status().expect("spawn");
    let took = t.elapsed();
    assert!(status.success(), "{c:?} failed");
    took
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--compare") {
        let rounds = args.get(1).and_then(|r| r.parse().ok());
        match rounds {
            Some(rounds) if args.len() > 2 => return compare(rounds, &args[2..]),
            _ => {
                eprintln!("usage: cli-bench --compare ROUNDS [--redis] LABEL=XTR_LOCK[,OPTION…]…");
                std::process::exit(2);
            }
        }
    }
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

/// A side of `--compare`: a build of `xtr-lock` with its options, or a floor.
struct Side {
    label: String,
    program: PathBuf,
    /// `run`'s options, for a build of `xtr-lock`; `None` for a floor.
    options: Option<Vec<String>>,
    /// The store a build runs on (a floor's is unused).
    dsn: String,
    samples: Vec<Duration>,
}

impl Side {
    /// `LABEL=XTR_LOCK[,OPTION…]`, on the store `dsn`.
    fn parse(spec: &str, dsn: &str) -> Side {
        let (label, rest) = spec
            .split_once('=')
            .unwrap_or_else(|| panic!("{spec}: not LABEL=XTR_LOCK[,OPTION…]"));
        let mut words = rest.split(',');
        let program = PathBuf::from(words.next().unwrap_or_default());
        assert!(program.exists(), "{}: no such file", program.display());
        Side {
            label: label.to_owned(),
            program,
            options: Some(words.map(str::to_owned).collect()),
            dsn: dsn.to_owned(),
            samples: Vec::new(),
        }
    }

    fn floor(label: &str, program: &str) -> Side {
        Side {
            label: label.to_owned(),
            program: PathBuf::from(program),
            options: None,
            dsn: String::new(),
            samples: Vec::new(),
        }
    }

    /// `… true` on its store (a build of `xtr-lock`), or on `file` (`flock`).
    fn command(&self, file: &Path, command: &[&str]) -> Command {
        let mut c = Command::new(&self.program);
        match &self.options {
            Some(options) => {
                c.args(["run", "--store", &self.dsn])
                    .args(options)
                    .args(["r", "--"]);
            }
            None if self.program.ends_with("flock") => {
                c.arg(file);
            }
            None => return Command::new(command[0]),
        }
        c.args(command);
        c
    }
}

fn compare(rounds: usize, specs: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    let flock_dsn = format!("flock://{}", dir.path().display());
    let file = dir.path().join("flock1.lock");
    let (redis, specs) = match specs.first().map(String::as_str) {
        Some("--redis") => (Some(RedisServer::start()), &specs[1..]),
        _ => (None, specs),
    };
    let mut sides = vec![Side::floor("`true` alone", "/bin/true")];
    sides.push(Side::floor("`flock FILE true` (util-linux)", "flock"));
    for spec in specs {
        let mut side = Side::parse(spec, &flock_dsn);
        if let Some(redis) = &redis {
            let mut on_redis = Side::parse(spec, &format!("redis://127.0.0.1:{}/0", redis.port()));
            on_redis.label.push_str(", redis://");
            side.label.push_str(", flock://");
            sides.push(side);
            sides.push(on_redis);
        } else {
            sides.push(side);
        }
    }
    let true_cmd = ["/bin/true"];
    for side in &sides {
        for _ in 0..10 {
            once(&mut side.command(&file, &true_cmd)); // warm-up
        }
    }
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..sides.len()).collect()
        } else {
            (0..sides.len()).rev().collect()
        };
        for i in order {
            for _ in 0..PER_ROUND {
                let took = once(&mut sides[i].command(&file, &true_cmd));
                sides[i].samples.push(took);
            }
        }
    }
    let floor = quantile(&mut sides[1].samples.clone(), 0.5);
    println!("| `… true`, wall time per run | p50 | p90 | p99 | p50 / flock(1) |");
    println!("|---|---|---|---|---|");
    for side in &mut sides {
        let s = &mut side.samples;
        let p50 = quantile(s, 0.5);
        println!(
            "| {} | {} | {} | {} | {:.2}× |",
            side.label,
            human(p50),
            human(quantile(s, 0.9)),
            human(quantile(s, 0.99)),
            p50.as_secs_f64() / floor.as_secs_f64()
        );
    }
    println!();
    println!("{} runs each, in {rounds} rounds.", rounds * PER_ROUND);
    println!();
    println!(
        "| resident memory while the command runs | processes (RSS) | PSS, all | anonymous, all |"
    );
    println!("|---|---|---|---|");
    for side in sides.iter().filter(|s| s.options.is_some()) {
        let r = resident(side.command(&file, &["sh", "-c", "echo $$; exec cat"]));
        let mb = |kb: u64| kb as f64 / 1024.0;
        println!(
            "| {} | {} | {:.1} MB | {:.1} MB |",
            side.label,
            r.each,
            mb(r.pss),
            mb(r.anonymous)
        );
    }
}

/// The `q` quantile of `samples` (sorted here).
fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort_unstable();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

/// The resident memory of a run's processes but its command's.
struct Resident {
    /// Each one's name and RSS.
    each: String,
    /// The sum of their PSS (shared pages counted once), in kB.
    pss: u64,
    /// The sum of their anonymous memory (their own, not the executables' pages), in kB.
    anonymous: u64,
}

/// Starts `c`, whose command prints its pid and waits for its stdin to end, and reads the
/// resident memory of `c`'s processes but the command's.
fn resident(mut c: Command) -> Resident {
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let command: u32 = line.trim().parse().expect("the command's pid");
    // Started processes finish loading meanwhile.
    std::thread::sleep(Duration::from_millis(300));
    let (mut each, mut pss, mut anonymous) = (Vec::new(), 0, 0);
    for pid in descendants(child.id()) {
        if pid == command {
            continue;
        }
        let proc = PathBuf::from(format!("/proc/{pid}"));
        let rss = kb(&proc.join("status"), "VmRSS:");
        pss += kb(&proc.join("smaps_rollup"), "Pss:");
        anonymous += kb(&proc.join("smaps_rollup"), "Anonymous:");
        each.push(format!("{} {:.1} MB", name_of(&proc), rss as f64 / 1024.0));
    }
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    Resident {
        each: each.join(", "),
        pss,
        anonymous,
    }
}

/// A process's program, with its mode (`xtr-lock __watch`).
fn name_of(proc: &Path) -> String {
    let cmdline = std::fs::read(proc.join("cmdline")).unwrap_or_default();
    let words: Vec<String> = cmdline
        .split(|b| *b == 0)
        .take(2)
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    let program = Path::new(&words[0]).file_name().unwrap_or_default();
    let program = program.to_string_lossy();
    match words.get(1) {
        Some(arg) if arg.starts_with("__") => format!("{program} {arg}"),
        _ => program.into_owned(),
    }
}

/// `pid` and its descendants, from `/proc`.
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            // The name is in parentheses and may hold spaces: the fields after its end.
            let rest = &stat[stat.rfind(')')? + 2..];
            Some((p, rest.split(' ').nth(1)?.parse().ok()?))
        })
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found
}

/// The number of kB on the line of `file` that starts with `key`.
fn kb(file: &Path, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .trim_end_matches(" kB")
                .parse()
                .ok()
        })
        .unwrap_or(0)
}
