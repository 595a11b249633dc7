//! `xtr-lock-faults [--duration 10m] [--only NAME]… [--target NAME]… [--readers N]
//! [--xtr-lock PATH]`: the fault suite's long form. Runs every scenario (or those named) for the
//! duration (split evenly), prints one line per scenario and the totals, and exits 1 on any
//! violation.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use xtr_lock_faults::{Report, Scenario, run_with};

/// The command line.
struct Options {
    duration: Duration,
    only: Vec<String>,
    targets: Vec<String>,
    readers: Option<usize>,
    xtr: PathBuf,
}

impl Options {
    /// The arguments; `None` when `--help` was asked for (and printed).
    fn parse() -> anyhow::Result<Option<Options>> {
        let mut o = Options {
            duration: Duration::from_secs(60),
            only: Vec::new(),
            targets: Vec::new(),
            readers: None,
            xtr: std::env::current_exe()?.with_file_name("xtr-lock"),
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
            match arg.as_str() {
                "--duration" => o.duration = humantime::parse_duration(&value()?)?,
                "--only" => o.only.push(value()?),
                "--target" => o.targets.push(value()?),
                "--readers" => o.readers = Some(value()?.parse().context("--readers: a number")?),
                "--xtr-lock" => o.xtr = PathBuf::from(value()?),
                "-h" | "--help" => {
                    println!(
                        "usage: xtr-lock-faults [--duration 10m] [--only flock/kill-holder]… \
                         [--target pubsub]… [--readers 8] [--xtr-lock PATH]\n\
                         scenarios: {}",
                        Scenario::all(Duration::ZERO)
                            .iter()
                            .map(Scenario::name)
                            .collect::<Vec<_>>()
                            .join(" ")
                    );
                    return Ok(None);
                }
                other => bail!("unknown argument {other:?} (see --help)"),
            }
        }
        Ok(Some(o))
    }

    /// The scenarios `--only` and `--target` pick (every one without them).
    fn scenarios(&self) -> Vec<Scenario> {
        let mut scenarios = Scenario::all(Duration::ZERO);
        scenarios.retain(|s| self.only.is_empty() || self.only.contains(&s.name()));
        scenarios.retain(|s| {
            self.targets.is_empty() || self.targets.iter().any(|t| t == s.target.name())
        });
        scenarios
    }
}

fn main() -> anyhow::Result<()> {
    let Some(options) = Options::parse()? else {
        return Ok(());
    };
    let xtr = &options.xtr;
    if !xtr.exists() {
        bail!(
            "no xtr-lock binary at {}: build it (cargo build --release -p xtr-lock-cli) or pass --xtr-lock",
            xtr.display()
        );
    }
    let scenarios = options.scenarios();
    if scenarios.is_empty() {
        bail!("--only and --target match no scenario (see --help)");
    }
    let each = options.duration / u32::try_from(scenarios.len())?;
    let started = Instant::now();
    let (mut sections, mut faults, mut violations) = (0, 0, 0);
    println!(
        "{:<32} {:>9} {:>7} {:>6} {:>5} {:>5} {:>5} {:>6} {:>7} {:>10}",
        "scenario",
        "sections",
        "faults",
        "ok",
        "gave",
        "err",
        "lost",
        "fenced",
        "excused",
        "violations"
    );
    // A target's scenarios (adjacent in `Scenario::all`) share its servers.
    let mut servers = None;
    for mut s in scenarios {
        s.duration = each;
        if let Some(n) = options.readers {
            s.readers = n;
        }
        let r = run_with(xtr, &s, &mut servers)?;
        print_report(&r);
        sections += r.sections;
        faults += r.faults;
        violations += r.violations.len();
    }
    println!(
        "total: {sections} sections, {faults} faults injected, {violations} violations, in {}",
        humantime::format_duration(Duration::from_secs(started.elapsed().as_secs()))
    );
    if violations > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// A scenario's line, its violations and where its log was kept.
fn print_report(r: &Report) {
    println!(
        "{:<32} {:>9} {:>7} {:>6} {:>5} {:>5} {:>5} {:>6} {:>7} {:>10}",
        r.name,
        r.sections,
        r.faults,
        r.exits[0],
        r.exits[1],
        r.exits[2],
        r.exits[3],
        r.fenced_off,
        r.excused,
        r.violations.len()
    );
    for v in &r.violations {
        println!("  violation: {v}");
    }
    if let Some(log) = &r.log {
        println!("  log: {}", log.display());
    }
}
