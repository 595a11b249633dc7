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
mod workers;

use std::path::{Path, PathBuf};
use std::time::Duration;

use xtr_lock_testkit::etcd::EtcdCluster;
use xtr_lock_testkit::redis::RedisServer;

pub use faults::Fault;

/// Where the lock lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Lock files in a temp directory.
    Flock,
    /// One Redis server.
    Redis,
    /// A consensus quorum of three Redis servers.
    Quorum,
    /// A 3-member etcd cluster (the `xtr-lock` under test needs the `etcd` feature).
    Etcd,
}

/// One run: a target, a fault, how long, how many workers.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Where the lock lives.
    pub target: Target,
    /// What is done, again and again.
    pub fault: Fault,
    /// How long the workers contend (faults are injected all along).
    pub duration: Duration,
    /// How many processes contend.
    pub workers: usize,
    /// The lock's ttl (on expiring stores: renewed at a third of it).
    pub ttl: Duration,
}

impl Scenario {
    /// Every target with every fault that applies to it, each for `duration`.
    pub fn all(duration: Duration) -> Vec<Scenario> {
        use Fault::*;
        let mut out = Vec::new();
        let mut add = |target, faults: &[Fault]| {
            for &fault in faults {
                out.push(Scenario {
                    target,
                    fault,
                    duration,
                    workers: 4,
                    ttl: Duration::from_millis(1500),
                });
            }
        };
        add(
            Target::Flock,
            &[KillHolder, KillXtrLock, StopXtrLock, StopHolder],
        );
        add(
            Target::Redis,
            &[
                KillHolder,
                KillXtrLock,
                StopXtrLock,
                StopHolder,
                StopServer,
                RestartServerEmpty,
                Delay,
            ],
        );
        // No StopHolder: a quorum has no fencing tokens, and a holder paused past its lease
        // resumes believing it holds (as with any lease); nothing can refuse its writes.
        add(
            Target::Quorum,
            &[
                KillHolder,
                KillXtrLock,
                StopXtrLock,
                StopMembers(1),
                StopMembers(2),
                KillMembers(1),
                KillMembers(2),
                Delay,
            ],
        );
        // A lock on a Raft cluster: a member (the leader, or a follower) paused or killed and
        // brought back must change nothing; the holder's faults are every store's.
        add(
            Target::Etcd,
            &[
                KillHolder,
                KillXtrLock,
                StopXtrLock,
                StopHolder,
                StopMembers(1),
                KillLeader,
            ],
        );
        for s in out.iter_mut().filter(|s| s.target == Target::Etcd) {
            // etcd's leases are whole seconds.
            s.ttl = Duration::from_secs(1);
        }
        out
    }

    /// `flock/kill-holder`.
    pub fn name(&self) -> String {
        let target = match self.target {
            Target::Flock => "flock",
            Target::Redis => "redis",
            Target::Quorum => "quorum",
            Target::Etcd => "etcd",
        };
        format!("{target}/{}", self.fault.name())
    }
}

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
    /// Everything that went wrong, one line each: overlaps, tokens, leftovers, survivors.
    pub violations: Vec<String>,
}

/// The servers of a target, and the DSNs the workers use (through delay proxies for
/// [`Fault::Delay`]).
pub(crate) struct Stores {
    pub(crate) servers: Vec<RedisServer>,
    /// The etcd target's cluster.
    pub(crate) etcd: Option<EtcdCluster>,
    pub(crate) dsns: Vec<String>,
    /// The flock target's directory, removed when the run ends.
    _dir: Option<tempfile::TempDir>,
}

impl Stores {
    fn start(target: Target, fault: Fault) -> anyhow::Result<Stores> {
        let n = match target {
            Target::Flock => 0,
            Target::Redis => 1,
            Target::Quorum => 3,
            Target::Etcd => 0,
        };
        let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
        let timeouts = "?socket_connect_timeout=0.5&socket_timeout=0.5";
        let dsns = if target == Target::Flock {
            Vec::new()
        } else {
            servers
                .iter()
                .map(|s| {
                    let port = if fault == Fault::Delay {
                        proxy(s.port())?
                    } else {
                        s.port()
                    };
                    Ok(format!("redis://127.0.0.1:{port}/0{timeouts}"))
                })
                .collect::<anyhow::Result<_>>()?
        };
        let etcd = (target == Target::Etcd).then(|| EtcdCluster::start(3));
        let dsns = match &etcd {
            Some(cluster) => vec![cluster.dsn("")],
            None => dsns,
        };
        let (dir, dsns) = if target == Target::Flock {
            let dir = tempfile::Builder::new().prefix("xtr-faults-").tempdir()?;
            let dsn = format!("flock://{}", dir.path().display());
            (Some(dir), vec![dsn])
        } else {
            (None, dsns)
        };
        Ok(Stores {
            servers,
            etcd,
            dsns,
            _dir: dir,
        })
    }

    /// `--store D` for each DSN.
    pub(crate) fn args(&self) -> Vec<String> {
        self.dsns
            .iter()
            .flat_map(|d| ["--store".to_owned(), d.clone()])
            .collect()
    }
}

/// A delay proxy (1–3 ms each way) in front of `port`, on a thread of this process.
fn proxy(port: u16) -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let local = listener.local_addr()?.port();
    std::thread::spawn(move || {
        xtr_lock_testkit::delay_proxy::serve(
            listener,
            port,
            Duration::from_millis(1),
            Duration::from_millis(3),
        )
    });
    Ok(local)
}

/// The resource every worker contends for.
pub(crate) const RESOURCE: &str = "fault-suite";

/// Runs `scenario` with the `xtr-lock` binary at `xtr_lock`.
///
/// # Errors
///
/// When a server or a process cannot be started (not when the locks misbehave: that is in
/// the report's violations).
pub fn run(xtr_lock: &Path, scenario: &Scenario) -> anyhow::Result<Report> {
    let mut stores = Stores::start(scenario.target, scenario.fault)?;
    let work = tempfile::Builder::new()
        .prefix("xtr-faults-log-")
        .tempdir()?;
    let log: PathBuf = work.path().join("sections.log");
    std::fs::write(&log, "")?;
    let pool = workers::Pool::start(xtr_lock, &stores, scenario, &log);
    let faults = faults::inject(&mut stores, &pool, scenario);
    let exits = pool.stop();
    let text = std::fs::read_to_string(&log)?;
    let verdict = check::check(&text, scenario.fault.needs_fencing());
    let mut violations = verdict.violations;
    violations.extend(workers::survivors(&log));
    // Locks of killed holders last until their ttl at most, then nothing may be left.
    std::thread::sleep(scenario.ttl + Duration::from_millis(500));
    violations.extend(workers::leftovers(xtr_lock, &stores));
    Ok(Report {
        name: scenario.name(),
        sections: verdict.sections,
        faults,
        exits,
        fenced_off: verdict.fenced_off,
        violations,
    })
}
