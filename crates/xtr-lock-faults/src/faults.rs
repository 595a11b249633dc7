//! The faults, and the thread of the run that injects them.

use std::time::{Duration, Instant};

use rand::Rng as _;
use rand::seq::IndexedRandom as _;
use rustix::process::{Pid, Signal, kill_process, kill_process_group};

use crate::workers::{Pool, command_group};
use crate::{Scenario, Stores};

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
pub(crate) fn inject(stores: &mut Stores, pool: &Pool, scenario: &Scenario) -> usize {
    let end = Instant::now() + scenario.duration;
    let mut injected = 0;
    // Let the workers get going first.
    std::thread::sleep(Duration::from_millis(300));
    while Instant::now() < end {
        let pause = Duration::from_millis(rand::rng().random_range(200..600));
        std::thread::sleep(pause);
        if once(stores, pool, scenario) {
            injected += 1;
        }
    }
    injected
}

/// A random worker's running `xtr-lock` that holds the lock (it runs its command), if one
/// does; tried for a little while, since most runs are waiting at any moment.
fn victim(pool: &Pool) -> Option<u32> {
    for _ in 0..50 {
        let holding: Vec<u32> = pool
            .running
            .iter()
            .filter_map(|s| *s.lock().unwrap_or_else(|e| e.into_inner()))
            .filter(|&pid| command_group(pid).is_some())
            .collect();
        if let Some(&pid) = holding.choose(&mut rand::rng()) {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

fn pid(n: u32) -> Option<Pid> {
    Pid::from_raw(i32::try_from(n).ok()?)
}

fn once(stores: &mut Stores, pool: &Pool, scenario: &Scenario) -> bool {
    let past_ttl = scenario.ttl + scenario.ttl / 2;
    match scenario.fault {
        Fault::KillHolder | Fault::KillXtrLock | Fault::Delay => {
            let Some(xtr) = victim(pool).and_then(pid) else {
                return false;
            };
            let group = command_group(xtr.as_raw_nonzero().get().unsigned_abs());
            let _ = kill_process(xtr, Signal::KILL);
            if scenario.fault == Fault::KillHolder
                && let Some(g) = group.and_then(Pid::from_raw)
            {
                let _ = kill_process_group(g, Signal::KILL);
            }
            true
        }
        Fault::StopXtrLock | Fault::StopHolder => {
            let Some(xtr) = victim(pool).and_then(pid) else {
                return false;
            };
            let group = (scenario.fault == Fault::StopHolder)
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
        Fault::KillLeader => {
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
        Fault::StopServer | Fault::StopMembers(_) => {
            let n = match scenario.fault {
                Fault::StopMembers(n) => n,
                _ => 1,
            };
            for s in &stores.servers[..n] {
                s.pause();
            }
            std::thread::sleep(Duration::from_secs(1));
            for s in &stores.servers[..n] {
                s.resume();
            }
            true
        }
        Fault::RestartServerEmpty => {
            stores.servers[0].restart();
            true
        }
        Fault::KillMembers(n) => {
            for s in &mut stores.servers[..n] {
                s.kill();
            }
            std::thread::sleep(past_ttl);
            for s in &mut stores.servers[..n] {
                s.restart();
            }
            true
        }
    }
}
