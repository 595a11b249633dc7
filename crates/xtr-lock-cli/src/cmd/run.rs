//! `xtr-lock run`: take the lock, run the command, keep the lock alive, release, pass the
//! status on.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;
use xtr_lock::Lockable as _;

use anyhow::{Result, anyhow};
use rustix::process::{Pid, Signal};
use tokio::signal::unix::{SignalKind, signal};

use crate::config::{StoreConfig, Wait};
use crate::exit::Exit;

pub struct RunArgs {
    pub store: StoreConfig,
    pub wait: Wait,
    pub kill_after: Duration,
    pub resource: String,
    pub command: Vec<OsString>,
}

/// SIGINT, SIGTERM and SIGHUP, caught from the start: while waiting they end the wait cleanly,
/// while the command runs they are forwarded to it.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::INT,
            _ = self.term.recv() => Signal::TERM,
            _ = self.hup.recv() => Signal::HUP,
        }
    }
}

fn killed_by(sig: Signal) -> Exit {
    Exit::Command(u8::try_from(128 + sig.as_raw()).unwrap_or(255))
}

pub async fn run(args: RunArgs) -> Result<Exit> {
    let mut signals = Signals::new()?;
    let lock = args.store.lock(&args.resource, args.wait.ttl);
    let taken = tokio::select! {
        taken = super::take(&lock, &args.store, &args.wait) => taken?,
        sig = signals.recv() => {
            // Interrupted while waiting: whatever the dropped wait stored is taken back (the
            // release runs after that clean-up), and nothing runs.
            let _ = lock.release().await;
            return Ok(killed_by(sig));
        }
    };
    if !taken {
        if !args.wait.quiet {
            eprintln!("{}", super::conflict_message(&lock, &args.wait));
        }
        return Ok(Exit::Conflict(args.wait.conflict_exit_code));
    }
    let outcome = supervise(&args, &lock, &mut signals).await;
    // Released whatever happened to the command; a failed release is reported, not hidden.
    if let Err(err) = lock.release().await {
        eprintln!("xtr-lock: error: {err:#}");
        if outcome.as_ref().is_ok_and(|e| *e == Exit::Command(0)) {
            return Ok(Exit::Error);
        }
    }
    outcome
}

async fn supervise(args: &RunArgs, lock: &xtr_lock::Lock, signals: &mut Signals) -> Result<Exit> {
    // Renewed while the command runs, on stores where locks expire.
    let mut alive = if args.store.store.capabilities().expiring {
        Some(lock.keep_alive()?)
    } else {
        None
    };
    let mut cmd = tokio::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("XTR_LOCK_RESOURCE", &args.resource)
        .env("XTR_LOCK_STORE", &args.store.scheme)
        .env_remove("XTR_LOCK_FENCING_TOKEN");
    if let Some(token) = lock.fencing_token() {
        cmd.env("XTR_LOCK_FENCING_TOKEN", token.to_string());
    }
    let name = args.command[0].to_string_lossy().into_owned();
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("xtr-lock: error: command not found: {name}");
            return Ok(Exit::CannotRun(127));
        }
        Err(e) => {
            eprintln!("xtr-lock: error: cannot run {name}: {e}");
            return Ok(Exit::CannotRun(126));
        }
    };
    let pid = child
        .id()
        .and_then(|id| Pid::from_raw(id as i32))
        .ok_or_else(|| anyhow!("the command has no pid"))?;
    let lost = async {
        match alive.as_mut() {
            Some(a) => a.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    let mut lost_lock = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status?,
            // Forwarded: the command decides how to stop; the lock is released after it exits.
            sig = signals.recv() => forward(pid, sig),
            why = &mut lost, if !lost_lock => {
                lost_lock = true;
                eprintln!(
                    "xtr-lock: {why}; stopping the command (SIGTERM, then SIGKILL after {})",
                    crate::output::short(args.kill_after)
                );
                forward(pid, Signal::TERM);
                let grace = tokio::time::sleep(args.kill_after);
                tokio::select! {
                    status = child.wait() => break status?,
                    () = grace => {
                        forward(pid, Signal::KILL);
                        break child.wait().await?;
                    }
                }
            }
        }
    };
    if lost_lock {
        return Ok(Exit::Lost);
    }
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Command(u8::try_from(code).unwrap_or(1)),
        (None, Some(sig)) => Exit::Command(u8::try_from(128 + sig).unwrap_or(255)),
        (None, None) => Exit::Command(1),
    })
}

fn forward(pid: Pid, sig: Signal) {
    let _ = rustix::process::kill_process(pid, sig);
}
