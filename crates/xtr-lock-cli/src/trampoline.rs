//! `xtr-lock __exec-child PARENT GRACE_MS LEASE [json] -- COMMAND [ARG…]`: how `run` makes sure
//! its command does not outlive a killed `xtr-lock` on stores where the lock dies with it (on
//! flock, see the `sentinel` module).
//!
//! The command's process group starts with this small supervisor: it asks the kernel for
//! SIGTERM when its parent dies (a parent-death signal, which must be set in the child), checks
//! that the parent is still the one that started it, then runs the command in the same process
//! group and waits for it. It is the helper `run` forked at its start (see `helper`), or, where
//! there is none (a later turn of `--standby`), this executable started again in this mode. When the
//! parent dies, it stops the whole group as `run` would on a lost lock: SIGTERM, then SIGKILL
//! after the grace. Given a lease file (see the `lease` module), it also stops the group when
//! the lease `run` last told is about to end: `run` stopped or paused cannot renew it. Signals
//! sent to the group while the parent lives (forwarded by `run`, or from the terminal) reach the
//! command directly; the supervisor ignores them. It exits with the command's status (128 + N
//! for a signal N).

use std::ffi::OsString;
use std::process::{Command, ExitCode};
use std::time::Duration;

use rustix::process::{Pid, Signal, WaitOptions};
use tokio::signal::unix::{SignalKind, signal};

use crate::{exit, lease, output, procs};

/// The lease-file argument when there is none.
pub(crate) const NO_LEASE: &str = "-";

/// The option that makes the supervisor's messages JSON events, as `run --json` asks.
pub(crate) const JSON: &str = "json";

/// The first argument that selects this mode (never a subcommand a user types).
pub(crate) const ARG: &str = "__exec-child";

/// This executable, whatever it was started as and even if its file was replaced since.
pub(crate) const SELF_EXE: &str = "/proc/self/exe";

/// Runs the supervisor if this process was started as one; `None` otherwise.
pub(crate) fn run_if_asked() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != ARG {
        return None;
    }
    let number = |a: Option<OsString>| a.and_then(|a| a.into_string().ok()?.parse::<u64>().ok());
    let parent = number(args.next()).and_then(|p| i32::try_from(p).ok());
    let grace = number(args.next()).map(Duration::from_millis);
    let lease_path = args.next().filter(|p| p != NO_LEASE);
    let rest: Vec<OsString> = args.collect();
    let split = rest.iter().position(|a| a == "--").unwrap_or(rest.len());
    // Options between the lease and `--`: `json` (run --json: messages are events).
    output::set_json(rest[..split].iter().any(|a| a == JSON));
    let command: Vec<OsString> = rest.into_iter().skip(split + 1).collect();
    let (Some(parent), Some(grace), false) = (parent, grace, command.is_empty()) else {
        output::error_line(&format!("{ARG} is for xtr-lock run's own use"));
        return Some(ExitCode::from(exit::ERROR));
    };
    Some(supervise_command(parent, grace, lease_path, &command, &[]))
}

/// The supervisor's work, started as `__exec-child` or forked (see `helper`): ties itself to
/// `parent`'s life, then runs `command` (with `env` set, or removed for `None`, besides its
/// own) and waits for it; its exit code is the command's.
pub(crate) fn supervise_command(
    parent: i32,
    grace: Duration,
    lease_path: Option<OsString>,
    command: &[OsString],
    env: &[(OsString, Option<OsString>)],
) -> ExitCode {
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::TERM)) {
        output::error_line(&format!("cannot tie the command to xtr-lock's life: {e}"));
        return ExitCode::from(exit::ERROR);
    }
    if !parent_is(parent) {
        output::error_line("the process holding the lock is gone; the command does not run");
        return ExitCode::from(exit::LOST);
    }
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let lease = match lease_path.map(|p| lease::Reader::open(std::path::Path::new(&p))) {
        Some(Ok(reader)) => Some(reader),
        Some(Err(e)) => {
            output::error_line(&format!("cannot read the lock's lease from xtr-lock: {e}"));
            return ExitCode::from(exit::ERROR);
        }
        None => None,
    };
    runtime.block_on(supervise(parent, grace, lease, command, env))
}

/// Catches, to ignore them, the signals other than SIGTERM, SIGINT and SIGHUP (which the caller
/// watches) that would end a helper process in the command's group, and that are sent to the
/// group for the command (`kill -USR1 -- -PGID` to rotate its logs, SIGQUIT from `Ctrl-\`): the helper lives
/// on, and `run` does not take its end for the command's. Once caught, a signal stays caught.
pub(crate) fn ignore_the_commands_signals() -> std::io::Result<()> {
    [
        SignalKind::quit(),
        SignalKind::user_defined1(),
        SignalKind::user_defined2(),
        SignalKind::alarm(),
    ]
    .into_iter()
    .try_for_each(|kind| signal(kind).map(drop))
}

/// The current-thread runtime of a helper process; the exit code, said why, if it cannot start.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            output::error_line(&format!("cannot start the async runtime: {e}"));
            ExitCode::from(exit::ERROR)
        })
}

/// Whether this process's parent is still `parent` (once it dies, another process adopts it).
pub(crate) fn parent_is(parent: i32) -> bool {
    rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) == Some(parent)
}

async fn supervise(
    parent: i32,
    grace: Duration,
    mut lease: Option<lease::Reader>,
    command: &[OsString],
    env: &[(OsString, Option<OsString>)],
) -> ExitCode {
    let signals = (
        signal(SignalKind::child()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    let (Ok(mut exits), Ok(mut term), Ok(mut int), Ok(mut hup), Ok(())) = (
        signals.0,
        signals.1,
        signals.2,
        signals.3,
        ignore_the_commands_signals(),
    ) else {
        output::error_line("cannot watch signals");
        return ExitCode::from(exit::ERROR);
    };
    let pid = match spawn(command, env) {
        Ok(pid) => pid,
        Err(code) => return code,
    };
    let mut orphaned_at: Option<tokio::time::Instant> = None;
    let mut lease_ending = false;
    loop {
        if let Some(code) = exit_code(pid) {
            if let Some(at) = orphaned_at {
                // What the command left behind in its group gets the rest of the grace.
                procs::outlast_group(at + grace).await;
            } else if lease_ending {
                // Stopped because the lease was about to end: what the command left (a child
                // that ignores SIGTERM) must not outlive it, whether or not `run` can act.
                procs::outlast_group(tokio::time::Instant::now()).await;
            }
            return code;
        }
        let kill_at = orphaned_at.map(|t| t + grace);
        tokio::select! {
            _ = exits.recv() => {}
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = hup.recv() => {}
            () = async { tokio::time::sleep_until(kill_at.expect("guarded")).await },
                if kill_at.is_some() => {
                let _ = rustix::process::kill_process_group(rustix::process::getpgrp(), Signal::KILL);
            }
            () = tokio::time::sleep(lease::POLL), if lease.is_some() => {
                check_lease(lease.as_mut().expect("guarded"), grace, &mut lease_ending);
            }
        }
        if orphaned_at.is_none() && !parent_is(parent) {
            // xtr-lock died: its lock will not be renewed. Stop the group, as a loss would.
            orphaned_at = Some(tokio::time::Instant::now());
            procs::terminate_group();
        }
    }
}

/// Starts `command` with `env` set (or removed, for `None`); the exit code, said why, where it
/// cannot run (127: not found, 126).
fn spawn(command: &[OsString], env: &[(OsString, Option<OsString>)]) -> Result<Pid, ExitCode> {
    let name = command[0].to_string_lossy().into_owned();
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..]);
    for (name, value) in env {
        match value {
            Some(value) => cmd.env(name, value),
            None => cmd.env_remove(name),
        };
    }
    match cmd.spawn() {
        Ok(child) => Pid::from_raw(child.id() as i32).ok_or(ExitCode::from(exit::ERROR)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            output::error_line(&format!("command not found: {name}"));
            Err(ExitCode::from(127))
        }
        Err(e) => {
            output::error_line(&format!("cannot run {name}: {e}"));
            Err(ExitCode::from(126))
        }
    }
}

/// Stops the group when the lease `run` last told is about to end: SIGTERM first, SIGKILL
/// (this process too) just before the lease ends.
fn check_lease(reader: &mut lease::Reader, grace: Duration, ending: &mut bool) {
    let Some(told) = reader.read() else {
        return;
    };
    let (term_at, kill_at) = told.deadlines(grace);
    let now = lease::now_ns();
    let group = rustix::process::getpgrp();
    if now >= kill_at {
        reader.mark_stopped();
        let _ = rustix::process::kill_process_group(group, Signal::KILL);
    } else if now >= term_at && !*ending {
        *ending = true;
        reader.mark_stopped();
        let _ = rustix::process::kill_process_group(group, Signal::TERM);
        let _ = rustix::process::kill_process_group(group, Signal::CONT);
    } else if now < term_at {
        // Renewed after all: a later end.
        *ending = false;
    }
}

/// The command's exit status as ours, once it has exited.
fn exit_code(pid: Pid) -> Option<ExitCode> {
    let (_, status) = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG).ok()??;
    procs::shell_code(status).map(ExitCode::from)
}
