//! The command `run` supervises: started in its own process group, which a watcher leads on
//! flock, where the command holds the lock's descriptors and outlives a killed `xtr-lock`, as
//! under flock(1), though not its killed process group (see `sentinel`), and a supervisor heads
//! where the lock dies with `xtr-lock` (see `trampoline`); reaped with its stops seen; signalled
//! as a group.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use anyhow::{Context as _, Result};
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus};
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::Exit;
use crate::lease;
use crate::procs;
use crate::sentinel::Sentinel;
use crate::trampoline;

/// How the command is tied to the lock.
pub(super) enum Tie {
    /// It inherits these descriptors, which hold the lock for as long as it keeps them open:
    /// the lock outlives a killed `xtr-lock`, as under `flock(1)`. A watcher leading the
    /// command's group stops the group (SIGTERM, then SIGKILL after `grace`) if `xtr-lock`'s
    /// whole process group is killed, as `flock(1)`'s command dies with flock's group (see
    /// `sentinel`).
    Descriptors {
        fds: Vec<OwnedFd>,
        grace: std::time::Duration,
    },
    /// The lock dies with `xtr-lock` (a lease it renews, a connection it holds): if `xtr-lock`
    /// dies, a supervisor in the command's group stops the group (SIGTERM, then SIGKILL after
    /// `grace`); with a `lease` file, also when the lease told there is about to end.
    ParentDeath {
        grace: std::time::Duration,
        lease: Option<lease::Writer>,
    },
    /// Nothing is locked (the null store).
    None,
}

/// A started command.
pub(super) struct Child {
    pid: Pid,
    /// Its process group: its pid, or the watcher's (flock).
    group: Pid,
    /// SIGCHLD, registered before the command was started, so no exit is missed.
    exits: tokio::signal::unix::Signal,
    /// Where the supervisor learns until when the lock is held.
    lease: Option<lease::Writer>,
    /// The sentinel in `xtr-lock`'s group and the watcher of the command's (flock); they end
    /// after the command.
    sentinel: Option<Sentinel>,
}

/// How a wait for the command ended.
pub(super) enum Event {
    Exited(Exit),
    /// It was stopped (Ctrl-Z, SIGSTOP).
    Stopped,
}

impl Child {
    /// Starts `command` in a new process group, with the variables of `env` set (or removed,
    /// for `None`), tied to the lock as `tie` says. `Err(exit)` when it cannot be run (126,
    /// 127), after saying why on stderr.
    pub(super) fn start(
        command: &[OsString],
        env: &[(&str, Option<OsString>)],
        tie: Tie,
    ) -> Result<std::result::Result<Child, Exit>> {
        let exits = signal(SignalKind::child()).context("cannot watch for the command's exit")?;
        let sentinel = match &tie {
            Tie::Descriptors { grace, .. } => Some(
                Sentinel::start(*grace)
                    .context("cannot start the sentinel of xtr-lock's process group")?,
            ),
            _ => None,
        };
        let forked = match &tie {
            Tie::ParentDeath { grace, lease } => crate::helper::take().and_then(|helper| {
                let lease = lease.as_ref().map(lease::Writer::path);
                // Where it died: started again below, as before it existed.
                helper.supervise(*grace, lease, env, command).ok()
            }),
            _ => None,
        };
        let pid = match forked {
            Some(pid) => pid,
            None => match spawn(command, env, &tie, sentinel.as_ref())? {
                Ok(pid) => pid,
                Err(cannot_run) => return Ok(Err(cannot_run)),
            },
        };
        let lease = match tie {
            Tie::ParentDeath { lease, .. } => lease,
            _ => None,
        };
        Ok(Ok(Child {
            pid,
            group: sentinel.as_ref().map_or(pid, Sentinel::group),
            exits,
            lease,
            sentinel,
        }))
    }

    /// Whether the supervisor stopped the command because its lease was about to end.
    pub(super) fn stopped_for_lease(&self) -> bool {
        self.lease.as_ref().is_some_and(lease::Writer::was_stopped)
    }

    /// Tells the supervisor that the lock is certainly held for `remaining` more (of `ttl`).
    pub(super) fn tell_lease(&self, remaining: std::time::Duration, ttl: std::time::Duration) {
        if let Some(writer) = &self.lease {
            writer.tell(lease::Lease::from_now(remaining, ttl));
        }
    }

    /// The command's process group.
    pub(super) fn group(&self) -> Pid {
        self.group
    }

    /// Waits until the command exits or stops.
    ///
    /// Cancel-safe: a dropped wait misses nothing (the status stays with the kernel until the
    /// next wait reads it).
    pub(super) async fn wait(&mut self) -> Result<Event> {
        loop {
            let status = rustix::process::waitpid(
                Some(self.pid),
                WaitOptions::NOHANG | WaitOptions::UNTRACED,
            )
            .context("cannot wait for the command")?;
            if let Some((_, status)) = status
                && let Some(event) = event_of(status)
            {
                return Ok(event);
            }
            self.exits.recv().await;
        }
    }

    /// Sends `sig` to the command's whole process group (the watcher blocks what it can).
    pub(super) fn signal_group(&self, sig: Signal) {
        let _ = rustix::process::kill_process_group(self.group, sig);
    }

    /// Whether anything of the command's process group is still running (its own children,
    /// once it exited); zombies and the watcher do not count.
    pub(super) fn group_alive(&self) -> bool {
        let watcher = self
            .sentinel
            .as_ref()
            .map(|s| s.group().as_raw_nonzero().get());
        rustix::process::test_kill_process_group(self.group).is_ok()
            && crate::procs::running_in_group(self.group.as_raw_nonzero().get(), watcher)
    }
}

/// Starts `command` as [`Child::start`] says: the command itself, in the watcher's group where
/// there is one, or its supervisor started as this executable again, in a group of its own.
fn spawn(
    command: &[OsString],
    env: &[(&str, Option<OsString>)],
    tie: &Tie,
    sentinel: Option<&Sentinel>,
) -> Result<std::result::Result<Pid, Exit>> {
    let mut cmd = match tie {
        Tie::ParentDeath { grace, lease } => {
            supervised(command, *grace, lease.as_ref().map(lease::Writer::path))
        }
        Tie::Descriptors { .. } | Tie::None => {
            let mut cmd = Command::new(&command[0]);
            cmd.args(&command[1..]);
            cmd
        }
    };
    // Into the watcher's group where there is one: the watcher starts beside the command.
    cmd.process_group(sentinel.map_or(0, |s| s.group().as_raw_nonzero().get()));
    for (name, value) in env {
        match value {
            Some(value) => cmd.env(name, value),
            None => cmd.env_remove(name),
        };
    }
    // Inherited: duplicates without close-on-exec, alive until the command is started.
    let inherited: Vec<OwnedFd> = match tie {
        Tie::Descriptors { fds, .. } => {
            fds.iter()
                .map(rustix::io::dup)
                .collect::<Result<_, _>>()
                .context("cannot hand the lock's descriptor to the command")?
        }
        _ => Vec::new(),
    };
    let name = command[0].to_string_lossy().into_owned();
    let spawned = cmd.spawn();
    drop(inherited);
    match spawned {
        Ok(child) => Ok(Ok(
            Pid::from_raw(child.id() as i32).context("the command has no pid")?
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::output::error_line(&format!("command not found: {name}"));
            Ok(Err(Exit::CannotRun(127)))
        }
        Err(e) => {
            crate::output::error_line(&format!("cannot run {name}: {e}"));
            Ok(Err(Exit::CannotRun(126)))
        }
    }
}

/// `command` under its supervisor (see `trampoline`): stopped after `grace` when `xtr-lock` dies;
/// with `lease`, also when the lease told there is about to end.
fn supervised(
    command: &[OsString],
    grace: std::time::Duration,
    lease: Option<&std::path::Path>,
) -> Command {
    let mut cmd = Command::new(trampoline::SELF_EXE);
    cmd.arg0("xtr-lock")
        .arg(trampoline::ARG)
        .arg(rustix::process::getpid().as_raw_nonzero().to_string())
        .arg(grace.as_millis().to_string())
        .arg(lease.map_or_else(
            || OsString::from(trampoline::NO_LEASE),
            |p| p.as_os_str().to_owned(),
        ))
        .args(crate::output::json().then_some(trampoline::JSON))
        .arg("--")
        .args(command);
    cmd
}

fn event_of(status: WaitStatus) -> Option<Event> {
    if status.stopped() {
        return Some(Event::Stopped);
    }
    procs::shell_code(status).map(|code| Event::Exited(Exit::Command(code)))
}
