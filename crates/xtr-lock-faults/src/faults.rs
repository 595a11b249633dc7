//! The faults, and the thread of the run that injects them.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::Rng as _;
use rustix::process::{Pid, Signal, kill_process, kill_process_group};

use crate::stores::Stores;
use crate::workers::{Pool, command_group};
use crate::{Scenario, Target};

/// What is done to the processes or the servers, again and again during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a holder: its `xtr-lock` and its command's process group, as a machine dies.
    KillHolder,
    /// SIGKILL the `xtr-lock` process alone: its command must not outlive it.
    KillXtrLock,
    /// SIGSTOP the `xtr-lock` process alone for longer than the ttl: it cannot renew, and its
    /// command must be stopped before the lease ends.
    StopXtrLock,
    /// SIGSTOP a whole holder for longer than the ttl, then SIGCONT: it resumes after losing
    /// its lock, and its writes carry a token the fenced resource refuses.
    StopHolder,
    /// SIGSTOP the (first) server for a second, then SIGCONT.
    StopServer,
    /// Restart the server empty (no persistence): every lock in it is gone.
    RestartServerEmpty,
    /// SIGSTOP this many quorum members for a second.
    StopMembers(usize),
    /// SIGKILL this many quorum members and restart them empty after the ttl (Redlock's delayed
    /// restart: a member back at once, empty, can turn a lock held on exactly a majority into
    /// a minority, and another holder can then win; the suite saw it with one member).
    KillMembers(usize),
    /// SIGKILL the etcd cluster's leader and start it again after the ttl (it rejoins with its
    /// data): the cluster elects another and the locks, their leases and their queues go on.
    KillLeader,
    /// Every connection goes through a proxy that delays each chunk by 1–3 ms each way; and
    /// `xtr-lock` processes are killed now and then.
    Delay,
    /// Kill the server and start it again at once: Redis and Memcached come back empty, the
    /// databases with their tables (session locks are gone with their sessions).
    RestartServer,
    /// End a holder's server-side sessions (`pg_terminate_backend`, MariaDB's `KILL`, Redis's
    /// `CLIENT KILL`), as an administrator or a proxy would.
    TerminateBackend,
    /// Partition a holder from the server: every worker reaches the servers through proxies of
    /// its own, and the holder's freeze (nothing forwarded either way, no reset) for 1.5 ttls,
    /// then thaw and deliver what they held.
    Partition,
    /// No fault: 8 more workers that only read contend with the writers (pub/sub readers were
    /// found inside a writer only with about 8 readers).
    ReadMix,
}

impl Fault {
    pub(crate) fn name(self) -> String {
        match self {
            Fault::KillHolder => "kill-holder".into(),
            Fault::KillXtrLock => "kill-xtr-lock".into(),
            Fault::StopXtrLock => "stop-xtr-lock".into(),
            Fault::StopHolder => "stop-holder".into(),
            Fault::StopServer => "stop-server".into(),
            Fault::RestartServerEmpty => "restart-server-empty".into(),
            Fault::StopMembers(n) => format!("stop-{n}-members"),
            Fault::KillMembers(n) => format!("kill-{n}-members"),
            Fault::Delay => "delay-proxy".into(),
            Fault::KillLeader => "kill-leader".into(),
            Fault::RestartServer => "restart-server".into(),
            Fault::TerminateBackend => "terminate-backend".into(),
            Fault::Partition => "partition".into(),
            Fault::ReadMix => "read-mix".into(),
        }
    }

    /// Whether a third of the sections ignore SIGTERM: where `xtr-lock` is alive but silent
    /// (stopped, partitioned) only its lease switch protects, and its SIGKILL must land before
    /// the lease ends whatever the command does with SIGTERM. Not where `xtr-lock` dies: a lock
    /// that dies with it is free at once, and only SIGTERM can follow.
    pub(crate) fn stubborn(self) -> bool {
        matches!(self, Fault::StopXtrLock | Fault::Partition)
    }

    /// Whether this fault destroys a lock under its holder on `target`, which learns it only
    /// at its next check: the server restarted without the lock, or the session holding it
    /// ended. Without fencing tokens nothing can refuse that holder's writes until it stops its
    /// command, so the checker bounds how long it may run on instead (see `check`).
    pub(crate) fn destroys_lock(self, target: Target) -> bool {
        let session = matches!(target, Target::PubSub | Target::Advisory | Target::GetLock);
        match self {
            Fault::RestartServer => session || target == Target::Memcached,
            Fault::TerminateBackend => session,
            _ => false,
        }
    }

    /// Whether only fencing can protect against this fault: it pauses a whole holder (which
    /// resumes believing it holds), or destroys the lock (a server restarted empty), so the
    /// checker models a fenced resource. Every other fault must be survived by the lock alone.
    pub(crate) fn needs_fencing(self) -> bool {
        matches!(self, Fault::StopHolder | Fault::RestartServerEmpty)
    }
}

/// Injects `scenario.fault` until the run's duration is over; returns how many were injected.
pub(crate) fn inject(stores: &mut Stores, pool: &Pool, scenario: &Scenario, log: &Path) -> usize {
    let end = Instant::now() + scenario.duration;
    let mut injected = 0;
    if scenario.fault == Fault::ReadMix {
        std::thread::sleep(scenario.duration);
        return 0;
    }
    // Let the workers get going first.
    std::thread::sleep(Duration::from_millis(300));
    while Instant::now() < end {
        let pause = Duration::from_millis(rand::rng().random_range(200..600));
        std::thread::sleep(pause);
        if once(stores, pool, scenario, log) {
            injected += 1;
        }
    }
    injected
}

/// A holder: its worker, its `xtr-lock`'s pid, its section.
struct Victim {
    worker: usize,
    pid: Pid,
    section: String,
}

/// The holders now: the workers' running `xtr-lock`s that run their command.
fn holders(pool: &Pool) -> Vec<Victim> {
    pool.running
        .iter()
        .enumerate()
        .filter_map(|(worker, s)| {
            let (n, section) = crate::mutex::lock(s).clone()?;
            command_group(n)?;
            Some(Victim {
                worker,
                pid: pid(n)?,
                section,
            })
        })
        .collect()
}

/// A random holder, if one holds; tried for a little while, since most runs are waiting at
/// any moment.
fn victim(pool: &Pool) -> Option<Victim> {
    for _ in 0..200 {
        let mut all = holders(pool);
        if !all.is_empty() {
            let i = rand::rng().random_range(0..all.len());
            return Some(all.swap_remove(i));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Appends `line` to the sections' log (the checker's marks).
fn mark(log: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(log) {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

fn pid(n: u32) -> Option<Pid> {
    Pid::from_raw(i32::try_from(n).ok()?)
}

/// Injects the scenario's fault once; whether it was (a holder fault needs a holder).
fn once(stores: &mut Stores, pool: &Pool, scenario: &Scenario, log: &Path) -> bool {
    let past_ttl = scenario.ttl + scenario.ttl / 2;
    match scenario.fault {
        Fault::ReadMix => false,
        Fault::RestartServer => restart_server(stores, scenario, log),
        Fault::TerminateBackend => terminate_backend(stores, pool, scenario, log),
        Fault::Partition => partition(stores, pool, past_ttl),
        Fault::KillHolder | Fault::KillXtrLock | Fault::Delay => kill_holder(pool, scenario.fault),
        Fault::StopXtrLock | Fault::StopHolder => stop_holder(pool, scenario.fault, past_ttl),
        Fault::StopMembers(n) if stores.etcd.is_some() => {
            let cluster = stores.etcd.as_ref().expect("an etcd cluster");
            for i in 0..n {
                cluster.pause(i);
            }
            std::thread::sleep(Duration::from_secs(1));
            for i in 0..n {
                cluster.resume(i);
            }
            true
        }
        Fault::KillLeader => kill_leader(stores, past_ttl),
        Fault::StopServer | Fault::StopMembers(_) => {
            let n = match scenario.fault {
                Fault::StopMembers(n) => n,
                _ => 1,
            };
            stores.pause(n);
            std::thread::sleep(Duration::from_secs(1));
            stores.resume(n);
            true
        }
        Fault::RestartServerEmpty => {
            stores.redis[0].restart();
            true
        }
        Fault::KillMembers(n) => {
            for s in &mut stores.redis[..n] {
                s.kill();
            }
            std::thread::sleep(past_ttl);
            for s in &mut stores.redis[..n] {
                s.restart();
            }
            true
        }
    }
}

/// [`Fault::RestartServer`], marked in the log where it destroys every lock.
fn restart_server(stores: &mut Stores, scenario: &Scenario, log: &Path) -> bool {
    if scenario.fault.destroys_lock(scenario.target) {
        mark(log, "destroyed-all");
    }
    stores.restart();
    true
}

/// [`Fault::TerminateBackend`]: a holder's sessions ended, marked in the log where that
/// destroys its lock.
fn terminate_backend(stores: &mut Stores, pool: &Pool, scenario: &Scenario, log: &Path) -> bool {
    let Some(v) = victim(pool) else {
        return false;
    };
    if stores.target == Target::GetLock {
        // MariaDB's process list shows no client address here: the session ended is
        // the lock's holder (`IS_USED_LOCK`), whichever holder that is.
        mark(log, "destroyed-all");
    } else if scenario.fault.destroys_lock(scenario.target) {
        mark(log, &format!("destroyed {}", v.section));
    }
    stores.terminate_sessions(v.pid.as_raw_nonzero().get().unsigned_abs())
}

/// [`Fault::Partition`]: a holder's proxies frozen for `past_ttl`, then thawed.
fn partition(stores: &Stores, pool: &Pool, past_ttl: Duration) -> bool {
    let Some(v) = victim(pool) else {
        return false;
    };
    let freeze = &stores.freezes[v.worker];
    freeze.freeze();
    std::thread::sleep(past_ttl);
    freeze.thaw();
    true
}

/// [`Fault::KillHolder`] (its command's group too), [`Fault::KillXtrLock`] and
/// [`Fault::Delay`]'s kills (the `xtr-lock` process alone).
fn kill_holder(pool: &Pool, fault: Fault) -> bool {
    let Some(xtr) = victim(pool).map(|v| v.pid) else {
        return false;
    };
    let group = command_group(xtr.as_raw_nonzero().get().unsigned_abs());
    let _ = kill_process(xtr, Signal::KILL);
    if fault == Fault::KillHolder
        && let Some(g) = group.and_then(Pid::from_raw)
    {
        let _ = kill_process_group(g, Signal::KILL);
    }
    true
}

/// [`Fault::StopXtrLock`] and [`Fault::StopHolder`] (its command's group too): stopped for
/// `past_ttl`, then continued.
fn stop_holder(pool: &Pool, fault: Fault, past_ttl: Duration) -> bool {
    let Some(xtr) = victim(pool).map(|v| v.pid) else {
        return false;
    };
    let group = (fault == Fault::StopHolder)
        .then(|| command_group(xtr.as_raw_nonzero().get().unsigned_abs()))
        .flatten()
        .and_then(Pid::from_raw);
    let _ = kill_process(xtr, Signal::STOP);
    if let Some(g) = group {
        let _ = kill_process_group(g, Signal::STOP);
    }
    std::thread::sleep(past_ttl);
    if let Some(g) = group {
        let _ = kill_process_group(g, Signal::CONT);
    }
    let _ = kill_process(xtr, Signal::CONT);
    true
}

/// [`Fault::KillLeader`]: the etcd cluster's leader killed, and started again after `past_ttl`.
fn kill_leader(stores: &mut Stores, past_ttl: Duration) -> bool {
    let Some(cluster) = stores.etcd.as_mut() else {
        return false;
    };
    let Some(leader) = cluster.leader() else {
        return false;
    };
    cluster.kill(leader);
    std::thread::sleep(past_ttl);
    cluster.restart(leader);
    true
}
