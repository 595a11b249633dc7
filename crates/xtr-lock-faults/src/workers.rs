//! The workers: threads that run `xtr-lock run` again and again, each run's command a shell
//! that logs its section; and the end-of-run checks on processes and stores.

use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rand::Rng as _;

use crate::Scenario;
use crate::stores::Stores;

/// The section: `enter`, three ticks `$TICK` seconds apart, `exit`, each its own `O_APPEND`
/// write. With `STUBBORN=1` it ignores SIGTERM (its `sleep`s inherit that): only SIGKILL stops
/// it.
const BODY: &str = r#"[ "$STUBBORN" = 1 ] && trap '' TERM
printf 'enter %s %s %s %s\n' "$SEC" "$MODE" "${XTR_LOCK_FENCING_TOKEN:--}" "$$" >> "$LOG"
for i in 1 2 3; do sleep "$TICK"; echo "tick $SEC" >> "$LOG"; done
echo "exit $SEC" >> "$LOG""#;

/// A worker's running `xtr-lock run`: its pid and its section's name.
pub(crate) type Slot = Arc<Mutex<Option<(u32, String)>>>;

pub(crate) struct Pool {
    stop: Arc<AtomicBool>,
    /// Per worker: its `xtr-lock run` while one runs.
    pub(crate) running: Vec<Slot>,
    threads: Vec<JoinHandle<[usize; 5]>>,
}

/// How a worker takes the lock.
#[derive(Clone, Copy)]
enum Mode {
    /// Exclusive three times in four, shared once.
    Mixed,
    /// Always shared.
    Reader,
}

impl Pool {
    /// `scenario.workers` mixed workers, then `scenario.readers` readers; worker `w` uses
    /// `stores.worker_args(w)`.
    pub(crate) fn start(xtr_lock: &Path, stores: &Stores, scenario: &Scenario, log: &Path) -> Pool {
        let stop = Arc::new(AtomicBool::new(false));
        let mut running = Vec::new();
        let mut threads = Vec::new();
        for w in 0..scenario.workers + scenario.readers {
            let slot: Slot = Arc::default();
            running.push(slot.clone());
            let (stop, xtr, log) = (stop.clone(), xtr_lock.to_owned(), log.to_owned());
            let mut args = vec!["run".to_owned()];
            args.extend(stores.worker_args(w));
            let ttl = format!("{}ms", scenario.ttl.as_millis());
            args.extend(["--ttl".into(), ttl, "-w".into(), "3s".into()]);
            // One section in five lasts 1.5 ttls: long enough to outlive a lease that is
            // not renewed.
            let long = format!("{:.3}", scenario.ttl.as_secs_f64() / 2.0);
            let mode = if w < scenario.workers {
                Mode::Mixed
            } else {
                Mode::Reader
            };
            let resource = stores.resource.clone();
            let stubborn = scenario.fault.stubborn();
            threads.push(std::thread::spawn(move || {
                let run = Run {
                    xtr: &xtr,
                    args: &args,
                    resource: &resource,
                    log: &log,
                    long_tick: &long,
                    mode,
                    stubborn,
                };
                worker(w, &run, &stop, &slot)
            }));
        }
        Pool {
            stop,
            running,
            threads,
        }
    }

    /// Stops the workers after their current run and adds up how their runs exited.
    pub(crate) fn stop(self) -> [usize; 5] {
        self.stop.store(true, Ordering::Relaxed);
        let mut exits = [0; 5];
        for t in self.threads {
            let mine = t.join().unwrap_or_default();
            for (sum, n) in exits.iter_mut().zip(mine) {
                *sum += n;
            }
        }
        exits
    }
}

/// What a worker runs, again and again.
struct Run<'a> {
    xtr: &'a Path,
    args: &'a [String],
    resource: &'a str,
    log: &'a Path,
    long_tick: &'a str,
    mode: Mode,
    /// Whether a third of the sections ignore SIGTERM.
    stubborn: bool,
}

fn worker(
    w: usize,
    run: &Run<'_>,
    stop: &AtomicBool,
    slot: &Mutex<Option<(u32, String)>>,
) -> [usize; 5] {
    let mut exits = [0; 5];
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let shared = match run.mode {
            Mode::Mixed => rand::rng().random_bool(0.25),
            Mode::Reader => true,
        };
        let tick = if rand::rng().random_bool(0.2) {
            run.long_tick
        } else {
            "0.01"
        };
        let section = format!("w{w}-{n}");
        let stubborn = run.stubborn && rand::rng().random_bool(1.0 / 3.0);
        let mut cmd = Command::new(run.xtr);
        cmd.args(run.args);
        if shared {
            cmd.arg("-s");
        }
        cmd.args([run.resource, "--", "sh", "-c", BODY])
            .env("SEC", &section)
            .env("MODE", if shared { "r" } else { "w" })
            .env("LOG", run.log)
            .env("TICK", tick)
            .env("STUBBORN", if stubborn { "1" } else { "0" })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let Ok(mut child) = cmd.spawn() else {
            exits[4] += 1;
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        *crate::mutex::lock(slot) = Some((child.id(), section));
        let status = child.wait();
        *crate::mutex::lock(slot) = None;
        let bucket = match status
            .ok()
            .and_then(|s| s.code().or(s.signal().map(|_| 99)))
        {
            Some(0) => 0,
            Some(1) => 1,
            Some(2) => 2,
            Some(3) => 3,
            _ => 4,
        };
        exits[bucket] += 1;
    }
    exits
}

/// The process group of the command `xtr-lock` with pid `xtr` runs (its supervisor's pid),
/// from the kernel's list of its children.
pub(crate) fn command_group(xtr: u32) -> Option<i32> {
    let tasks = std::fs::read_dir(format!("/proc/{xtr}/task")).ok()?;
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next() {
            return pid.parse().ok();
        }
    }
    None
}

/// Processes that still carry this run's log path in their environment: a section's shell, a
/// supervisor or an `xtr-lock run` that outlived the run.
pub(crate) fn survivors(log: &Path) -> Vec<String> {
    let needle = format!("LOG={}", log.display());
    // A process being killed as the run ended may linger a moment.
    for attempt in 0..50 {
        let found: Vec<String> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let env = std::fs::read(e.path().join("environ")).ok()?;
                let has = env.split(|b| *b == 0).any(|v| v == needle.as_bytes());
                has.then(|| {
                    let cmd = std::fs::read_to_string(e.path().join("cmdline")).unwrap_or_default();
                    format!(
                        "process {pid} survived the run: {}",
                        cmd.replace('\0', " ").trim()
                    )
                })
            })
            .collect();
        if found.is_empty() || attempt == 49 {
            return found;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Vec::new()
}
