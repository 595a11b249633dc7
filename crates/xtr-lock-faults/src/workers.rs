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

use crate::{RESOURCE, Scenario, Stores};

/// The section: `enter`, three ticks `$TICK` seconds apart, `exit`, each its own `O_APPEND`
/// write.
const BODY: &str = r#"printf 'enter %s %s %s %s\n' "$SEC" "$MODE" "${XTR_LOCK_FENCING_TOKEN:--}" "$$" >> "$LOG"
for i in 1 2 3; do sleep "$TICK"; echo "tick $SEC" >> "$LOG"; done
echo "exit $SEC" >> "$LOG""#;

pub(crate) struct Pool {
    stop: Arc<AtomicBool>,
    /// Per worker: the pid of its `xtr-lock run` while one runs.
    pub(crate) running: Vec<Arc<Mutex<Option<u32>>>>,
    threads: Vec<JoinHandle<[usize; 5]>>,
}

impl Pool {
    pub(crate) fn start(xtr_lock: &Path, stores: &Stores, scenario: &Scenario, log: &Path) -> Pool {
        let stop = Arc::new(AtomicBool::new(false));
        let mut running = Vec::new();
        let mut threads = Vec::new();
        for w in 0..scenario.workers {
            let slot: Arc<Mutex<Option<u32>>> = Arc::default();
            running.push(slot.clone());
            let (stop, xtr, log) = (stop.clone(), xtr_lock.to_owned(), log.to_owned());
            let mut args = vec!["run".to_owned()];
            args.extend(stores.args());
            let ttl = format!("{}ms", scenario.ttl.as_millis());
            args.extend(["--ttl".into(), ttl, "-w".into(), "3s".into()]);
            // One section in five lasts 1.5 ttls: long enough to outlive a lease that is
            // not renewed.
            let long = format!("{:.3}", scenario.ttl.as_secs_f64() / 2.0);
            threads.push(std::thread::spawn(move || {
                worker(w, &xtr, &args, &log, &long, &stop, &slot)
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

fn worker(
    w: usize,
    xtr: &Path,
    args: &[String],
    log: &Path,
    long_tick: &str,
    stop: &AtomicBool,
    slot: &Mutex<Option<u32>>,
) -> [usize; 5] {
    let mut exits = [0; 5];
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let shared = rand::rng().random_bool(0.25);
        let tick = if rand::rng().random_bool(0.2) {
            long_tick
        } else {
            "0.01"
        };
        let mut cmd = Command::new(xtr);
        cmd.args(args);
        if shared {
            cmd.arg("-s");
        }
        cmd.args([RESOURCE, "--", "sh", "-c", BODY])
            .env("SEC", format!("w{w}-{n}"))
            .env("MODE", if shared { "r" } else { "w" })
            .env("LOG", log)
            .env("TICK", tick)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let Ok(mut child) = cmd.spawn() else {
            exits[4] += 1;
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(child.id());
        let status = child.wait();
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
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

/// What is still held once every holder is gone and the killed ones' leases have ended: a free
/// lock must be taken at once (`run -n` exits 0), and on Redis no key may be left behind.
pub(crate) fn leftovers(xtr: &Path, stores: &Stores) -> Vec<String> {
    let mut out = Vec::new();
    let status = Command::new(xtr)
        .arg("run")
        .args(stores.args())
        .args(["--ttl", "5s", "-n", RESOURCE, "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !status.as_ref().is_ok_and(|s| s.success()) {
        out.push(format!("the lock was still held after the run: {status:?}"));
    }
    if let Some(cluster) = &stores.etcd {
        let keys =
            cluster.etcdctl_output(&["get", "--prefix", "--keys-only", &format!("{RESOURCE}/")]);
        if !keys.trim().is_empty() {
            out.push(format!(
                "etcd still has the lock's keys after the run: {keys:?}"
            ));
        }
    }
    for (i, server) in stores.servers.iter().enumerate() {
        if server.cli(&["EXISTS", RESOURCE]) != "0" {
            out.push(format!("server {i} still has the lock's key after the run"));
        }
    }
    out
}
