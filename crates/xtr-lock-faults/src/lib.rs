//! The fault suite: real `xtr-lock run` processes contend for one resource on real, throwaway
//! servers while faults are injected, and every critical section's steps go to one log that
//! [`check`] then proves correct.
//!
//! Each worker runs `xtr-lock run` again and again (a quarter of its runs shared); the command
//! is a shell that appends `enter`, three `tick`s and `exit` to the log. Faults hit a random
//! worker's processes or the servers, a few times per second of the run. At the end: the log is
//! checked, nothing may be left in the stores once the killed holders' leases have run out, and
//! no process that ran a section may survive.
//!
//! What cannot be protected is not injected, and [`Scenario::all`] says why where it leaves
//! something out: a whole holder paused past its lease resumes and writes with a token that a
//! fenced resource refuses, so that fault runs only where there are tokens (not on a quorum).

pub mod check;
mod faults;
mod mutex;
mod scenarios;
mod sockets;
mod stores;
mod workers;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub use faults::Fault;
pub use scenarios::{Scenario, Target};
pub use stores::Servers;

/// What one run saw.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The scenario's name.
    pub name: String,
    /// Critical sections entered.
    pub sections: usize,
    /// Faults injected.
    pub faults: usize,
    /// `xtr-lock run` exits: 0, 1 (gave up waiting), 2 (store error), 3 (lost), other.
    pub exits: [usize; 5],
    /// Log lines a fenced resource refused.
    pub fenced_off: usize,
    /// Overlaps with a holder whose lock a fault destroyed, ended within the bound.
    pub excused: usize,
    /// Everything that went wrong, one line each: overlaps, tokens, leftovers, survivors.
    pub violations: Vec<String>,
    /// The sections' log, kept when there were violations (else removed with the run).
    pub log: Option<PathBuf>,
}

/// Runs `scenario` with the `xtr-lock` binary at `xtr_lock`, on servers of its own.
///
/// # Errors
///
/// When a server or a process cannot be started (not when the locks misbehave: that is in
/// the report's violations).
pub fn run(xtr_lock: &Path, scenario: &Scenario) -> anyhow::Result<Report> {
    run_with(xtr_lock, scenario, &mut None)
}

/// Runs `scenario` on `servers` when they serve its target (else on new ones, left in
/// `servers` for the next scenario): a target's scenarios run one after another share them.
///
/// # Errors
///
/// As [`run`].
pub fn run_with(
    xtr_lock: &Path,
    scenario: &Scenario,
    servers: &mut Option<Servers>,
) -> anyhow::Result<Report> {
    let mine = match servers.take() {
        Some(s) if s.target() == scenario.target => s,
        _ => Servers::start(scenario.target)?,
    };
    let mut stores = stores::Stores::new(xtr_lock, mine, scenario)?;
    let report = run_on(xtr_lock, scenario, &mut stores);
    *servers = Some(stores.servers);
    report
}

fn run_on(
    xtr_lock: &Path,
    scenario: &Scenario,
    stores: &mut stores::Stores,
) -> anyhow::Result<Report> {
    let work = tempfile::Builder::new()
        .prefix("xtr-faults-log-")
        .tempdir()?;
    let log: PathBuf = work.path().join("sections.log");
    std::fs::write(&log, "")?;
    let clock = Clock::start(&log);
    let pool = workers::Pool::start(xtr_lock, stores, scenario, &log);
    let faults = faults::inject(stores, &pool, scenario, &log);
    let exits = pool.stop();
    clock.stop();
    let text = std::fs::read_to_string(&log)?;
    let rules = check::Rules {
        fenced: scenario.fault.needs_fencing(),
        destroyed_bound: scenario.destroyed_bound(),
    };
    let verdict = check::check_with(&text, rules);
    let mut violations = verdict.violations;
    violations.extend(workers::survivors(&log));
    // Locks of killed holders last until their ttl at most, then nothing may be left.
    violations.extend(stores::leftovers(
        xtr_lock,
        stores,
        scenario.leftover_wait(),
    ));
    let log = (!violations.is_empty()).then(|| work.keep().join("sections.log"));
    Ok(Report {
        name: scenario.name(),
        sections: verdict.sections,
        faults,
        exits,
        fenced_off: verdict.fenced_off,
        excused: verdict.excused,
        violations,
        log,
    })
}

/// The thread that appends a `clock` line to the log every [`check::CLOCK_TICK`].
struct Clock {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Clock {
    fn start(log: &Path) -> Clock {
        let stop = Arc::new(AtomicBool::new(false));
        let file = std::fs::OpenOptions::new().append(true).open(log);
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let Ok(mut file) = file else { return };
            let start = std::time::Instant::now();
            let mut n = 0u32;
            while !flag.load(Ordering::Relaxed) {
                n += 1;
                let next = start + check::CLOCK_TICK * n;
                std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
                let _ = file.write_all(b"clock\n");
            }
        });
        Clock { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}
