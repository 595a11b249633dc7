//! `xtr-lock run`: take the lock, run the command tied to it, keep the lock alive and watch it,
//! stop the command's process group if the lock is lost, release, pass the status on.

use std::ffi::OsString;
use std::time::Duration;

use anyhow::{Context as _, Result};
use rustix::process::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;
use xtr_lock::{KeepAlive, Lock, Lockable as _, LostReason, Release};

use serde_json::json;

use crate::args::{RunSettings, Take};
use crate::exit::Exit;
use crate::lease;
use crate::output::{self, causes, mode_name};
use crate::procs;
use crate::store::StoreConfig;

mod child;
mod hold;
mod standby;
mod terminal;

use child::{Child, Event, Tie};
use terminal::Terminal;

/// What `run` works with: its store, opened, and its settings.
struct RunArgs {
    store: StoreConfig,
    take: Take,
    kill_after: Duration,
    /// `-o`: the command does not inherit the lock's descriptors.
    close: bool,
    resource: String,
    /// As the command line named it, without the configuration entry's prefix.
    named: String,
    command: Vec<OsString>,
    /// What names the store for a nested `xtr-lock` (see [`crate::args::Source::nested_environment`]).
    nested: Vec<(&'static str, Option<OsString>)>,
    /// `--standby`: turns follow each other, each says when it leads.
    standby: bool,
    /// `--min-hold`, `--max-hold`.
    holds: crate::policy::Holds,
}

/// SIGINT, SIGTERM and SIGHUP, caught from the start: while waiting they end the wait cleanly,
/// while the command runs they are forwarded to its process group.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    /// The first SIGINT or SIGTERM received: a standby stops after the turn it ends.
    stop: Option<Signal>,
}

impl Signals {
    fn new() -> Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            stop: None,
        })
    }

    async fn recv(&mut self) -> Signal {
        let sig = tokio::select! {
            _ = self.int.recv() => Signal::INT,
            _ = self.term.recv() => Signal::TERM,
            _ = self.hup.recv() => return Signal::HUP,
        };
        self.stop.get_or_insert(sig);
        sig
    }
}

fn killed_by(sig: Signal) -> Exit {
    Exit::Command(procs::killed_by_code(sig.as_raw()))
}

/// `run` on `store`, as `settings` say.
pub(crate) async fn run(store: StoreConfig, settings: RunSettings) -> Result<Exit> {
    let RunSettings {
        source,
        take,
        kill_after,
        close,
        resource,
        named,
        command,
        standby,
        holds,
    } = settings;
    let args = RunArgs {
        store,
        take,
        kill_after,
        close,
        resource,
        named,
        command,
        nested: source.nested_environment(),
        standby: standby.is_some(),
        holds,
    };
    let mut signals = Signals::new()?;
    match standby {
        None => Ok(turn(&args, &mut signals).await?.exit),
        Some(max_restarts) => standby::run(&args, &mut signals, max_restarts).await,
    }
}

/// What one turn of `run` came to: its exit, and how long the command ran (`None`: it never
/// started, the lock not taken).
struct Turn {
    exit: Exit,
    ran: Option<Duration>,
}

impl Turn {
    fn not_run(exit: Exit) -> Result<Turn> {
        Ok(Turn { exit, ran: None })
    }
}

/// One turn: take the lock, run the command while it is held, release.
async fn turn(args: &RunArgs, signals: &mut Signals) -> Result<Turn> {
    let lock = hold::with_limits(args.store.lock(&args.resource, &args.take), args);
    let taken = tokio::select! {
        taken = super::take(&lock, &args.store, &args.take) => taken?,
        sig = signals.recv() => {
            // Interrupted while waiting: whatever the dropped wait stored is taken back (the
            // release runs after that clean-up, within the exit's bound), and nothing runs.
            let _ = crate::exit::bounded(lock.release()).await;
            return Turn::not_run(killed_by(sig));
        }
    };
    let took = match taken {
        Ok(took) => took,
        Err(refused) => {
            super::say_refused(&args.resource, &args.take, refused);
            return Turn::not_run(Exit::Conflict(args.take.conflict_exit_code));
        }
    };
    if output::json() {
        output::event(
            "acquired",
            json!({
                "resource": args.resource,
                "mode": lock.held_mode().map(mode_name),
                "fencing_token": lock.fencing_token(),
                "limit": lock.key().permits().map(|p| p.limit()),
                "permits": lock.key().permits().map(|p| p.count()),
                "ttl_ms": lock.ttl().map(|t| t.as_millis()),
                "waited_ms": took.as_secs_f64() * 1e3,
                "meta": lock.key().meta().map(|m| crate::meta::value(&m)),
            }),
        );
    }
    if args.standby {
        standby::leading(args, &lock);
    } else if args.take.verbose && !output::json() {
        eprintln!("{}", super::took_line(&lock, took));
    }
    let started = Instant::now();
    let outcome = supervise(args, &lock, signals, started).await;
    let ran = started.elapsed();
    Ok(Turn {
        exit: release(args, &lock, outcome, signals, started).await?,
        ran: Some(ran),
    })
}

/// Releases the lock whatever happened to the command: a lost lock is exit 3 however it is
/// found (after a maximum hold too: the lock ran out, or was taken, as the command stopped).
/// The exit waits for the store only so long: a release the store does not confirm in time
/// goes on in the background until the exit's bound, and is said to have failed.
async fn release(
    args: &RunArgs,
    lock: &Lock,
    outcome: Result<Exit>,
    signals: &mut Signals,
    acquired: Instant,
) -> Result<Exit> {
    let known = lock.lost_reason();
    let released = hold::release(args, lock, signals, acquired).await;
    match released {
        Ok(Release::Lost) => {
            // Also after a maximum hold: a lock that ran out (or was taken) while the command
            // stopped is a loss, told as one.
            if !matches!(outcome, Ok(Exit::Lost)) {
                let why = known.map_or_else(
                    || "the store had nothing of it when the command ended".to_owned(),
                    |reason| reason.to_string(),
                );
                report_loss(
                    &args.resource,
                    &format!(
                        "lock {:?} was lost while the command ran: {why}",
                        lock.resource()
                    ),
                    known,
                );
            }
            outcome.map(|_| Exit::Lost)
        }
        Ok(_) => {
            if output::json() {
                output::event("released", json!({"resource": args.resource}));
            }
            outcome
        }
        Err(err) => {
            output::error_line(&causes(&err));
            match outcome {
                Ok(Exit::Command(0)) => Ok(Exit::Error),
                other => other,
            }
        }
    }
}

/// The error of a release the store did not confirm before the exit's bound.
fn unconfirmed_release(lock: &Lock) -> xtr_lock::Error {
    xtr_lock::Error::storage(format!(
        "the store did not confirm the release within {:?}; it is left to the lock's ttl",
        crate::exit::SETTLE
    ))
    .with_resource(lock.resource())
}

/// Says a loss happened: a line, or a `lost` event (`why`: the reason as one word, as
/// `revoked`, where it is known).
fn report_loss(resource: &str, line: &str, why: Option<LostReason>) {
    if output::json() {
        output::event(
            "lost",
            json!({"resource": resource, "reason": line, "why": why.map(LostReason::label)}),
        );
    } else {
        eprintln!("xtr-lock: {line}");
    }
}

/// Runs the command while the lock is watched, until it exits, the lock is lost or held as
/// long as it may be.
async fn supervise(
    args: &RunArgs,
    lock: &Lock,
    signals: &mut Signals,
    acquired: Instant,
) -> Result<Exit> {
    // Renews on stores where locks expire; watches for a loss where the store can see one.
    let mut monitor = lock.keep_alive()?;
    let store = &args.store.store;
    let tie = tie(args, lock)?;
    let env = environment(args, lock);
    if args.take.verbose && !output::json() {
        let words: Vec<String> = args
            .command
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        eprintln!("xtr-lock: executing {}", words.join(" "));
    }
    let mut child = match Child::start(&args.command, &env, tie)? {
        Ok(child) => child,
        Err(cannot_run) => return Ok(cannot_run),
    };
    let terminal = Terminal::hand_to(child.group());
    let mut lease = LeaseView::default();
    lease.tell(lock, store.as_ref(), &child);
    // Often enough that the supervisor's view lags the renewals by little.
    let mut lease_ticks = tokio::time::interval(lease.tick(lock.ttl()));
    loop {
        tokio::select! {
            _ = lease_ticks.tick() => lease.tell(lock, store.as_ref(), &child),
            event = child.wait() => match event? {
                Event::Exited(_) if child.stopped_for_lease() => {
                    // The supervisor's SIGTERM ended the command; what it left (a child that
                    // ignores SIGTERM) must not outlive the lease: it is killed now.
                    kill_leftovers(&child).await;
                    return Ok(stopped_for_lease(args, lock, &mut monitor, acquired).await);
                }
                Event::Exited(exit) => {
                    if args.standby {
                        // The next turn (here or in another standby) must not run beside what
                        // this one left behind.
                        stop_leftovers(args, &child).await;
                    }
                    return Ok(exit);
                }
                Event::Stopped => {
                    if let Some(terminal) = &terminal {
                        terminal.relay_stop();
                    }
                }
            },
            // Forwarded: the command decides how to stop; the lock is released after it exits.
            sig = signals.recv() => child.signal_group(sig),
            lost = monitor.lost() => return hold::on_lost(args, &lost, &mut child, acquired).await,
        }
    }
}

/// How the command is tied to the lock: by the descriptors that hold it (flock, unless `-o`),
/// else by a supervisor that stops it when `xtr-lock` dies (and, with a lease file, before a
/// lease `xtr-lock` did not renew ends); nothing where nothing is locked.
fn tie(args: &RunArgs, lock: &Lock) -> Result<Tie> {
    let store = &args.store.store;
    let caps = store.capabilities();
    if !caps.excludes {
        return Ok(Tie::None);
    }
    Ok(match store.inheritable_descriptors(lock.key())? {
        Some(fds) if !args.close => Tie::Descriptors {
            fds,
            grace: hold::stop_grace(args),
        },
        _ => Tie::ParentDeath {
            grace: hold::stop_grace(args),
            // A lease that xtr-lock renews (itself, or the store for it, as etcd's): the
            // supervisor also stops the command when xtr-lock can no longer renew it
            // (stopped, paused) before the lease ends. (A lease nothing ends, as a session
            // lock's on a server without an idle limit, is told as such: never stopped.)
            lease: match caps.expiring || store.lease_remaining(lock.key()).is_some() {
                true => Some(lease::Writer::create().context("cannot create the lease file")?),
                false => None,
            },
        },
    })
}

/// What the command's environment gets besides the caller's: what names the store `run` used,
/// so that a nested `xtr-lock` uses it too, and what the lock tells the command, under names
/// of its own.
fn environment(args: &RunArgs, lock: &Lock) -> Vec<(&'static str, Option<OsString>)> {
    let mut env = args.nested.clone();
    env.extend([
        ("XTR_LOCK_RESOURCE", Some(args.named.clone().into())),
        (
            "XTR_LOCK_MODE",
            lock.held_mode().map(|m| mode_name(m).into()),
        ),
        (
            "XTR_LOCK_FENCING_TOKEN",
            lock.fencing_token().map(|t| t.to_string().into()),
        ),
        ("XTR_LOCK_SCHEME", Some(args.store.scheme.clone().into())),
        (
            // A lock's place (its file, its key); a semaphore's slots are not one place.
            "XTR_LOCK_LOCATION",
            match lock.key().permits() {
                Some(_) => None,
                None => args.store.store.location(&args.resource).map(Into::into),
            },
        ),
        (
            "XTR_LOCK_LIMIT",
            lock.key().permits().map(|p| p.limit().to_string().into()),
        ),
        (
            "XTR_LOCK_PERMITS",
            lock.key().permits().map(|p| p.count().to_string().into()),
        ),
    ]);
    env
}

/// The supervisor stopped the command before the lease ran out, xtr-lock not having renewed
/// it in time: the renewal's own verdict says why, soon.
async fn stopped_for_lease(
    args: &RunArgs,
    lock: &Lock,
    monitor: &mut KeepAlive,
    acquired: Instant,
) -> Exit {
    let wait = lock.remaining_lifetime().unwrap_or_default() + Duration::from_secs(1);
    let (why, reason) = match tokio::time::timeout(wait, monitor.lost()).await {
        Ok(lost) if lost.reason == LostReason::HeldTooLong => {
            // The supervisor's stop came just before the maximum hold's: that is what ended it.
            let line = format!(
                "lock {:?} was held for its maximum hold ({}); the command was stopped",
                args.resource,
                crate::output::short(acquired.elapsed())
            );
            hold::report_max_hold(&args.resource, acquired, &line);
            return Exit::HeldTooLong;
        }
        Ok(lost) => (loss_line(&lost), Some(lost.reason)),
        Err(_) => (
            format!(
                "lock {:?} was about to expire without being renewed in time",
                lock.resource()
            ),
            None,
        ),
    };
    report_loss(
        &args.resource,
        &format!("{why}; the command was stopped before its lease ended"),
        reason,
    );
    Exit::Lost
}

/// What `run` knows of its lease and tells the supervisor.
#[derive(Default)]
struct LeaseView {
    /// The longest lease confirmed so far: about what the store really keeps (less than
    /// `--ttl` on stores that count whole seconds; pub/sub's probe timeout), the margins' base.
    longest: Duration,
}

impl LeaseView {
    /// Tells the supervisor how long the lock certainly lasts: the shorter of the lock's
    /// confirmed lifetime and the store's own lease, where there is either. A lease nothing
    /// ends (`Duration::MAX`) is told as such, and is no base for the margins.
    fn tell(&mut self, lock: &Lock, store: &dyn xtr_lock::Store, child: &Child) {
        let remaining = match (lock.remaining_lifetime(), store.lease_remaining(lock.key())) {
            (Some(lifetime), Some(lease)) => Some(lifetime.min(lease)),
            (lifetime, lease) => lifetime.or(lease),
        };
        if let Some(remaining) = remaining {
            if remaining != Duration::MAX {
                self.longest = self.longest.max(remaining);
            }
            child.tell_lease(remaining, self.longest);
        }
    }

    /// How often to tell: a tenth of the lease (of `ttl` before any is known), 10–250 ms.
    fn tick(&self, ttl: Option<Duration>) -> Duration {
        let lease = match ttl {
            _ if !self.longest.is_zero() => self.longest,
            Some(ttl) => ttl,
            // No lifetime of the lock's own: a lease, if any, is the store's (etcd, pub/sub).
            None => Duration::MAX,
        };
        (lease / 10).clamp(Duration::from_millis(10), Duration::from_millis(250))
    }
}

/// A loss and the error that showed it, with its causes (a refresh that kept failing).
fn loss_line(lost: &xtr_lock::LockLost) -> String {
    causes(&xtr_lock::Error::from(lost.clone()))
}

/// Stops the command's process group: SIGTERM, then SIGKILL for whatever of it is still there
/// after `grace`, its own children included.
async fn stop(child: &mut Child, grace: Duration) -> Result<()> {
    let deadline = Instant::now() + grace;
    child.signal_group(Signal::TERM);
    // A stopped process would not see its SIGTERM.
    child.signal_group(Signal::CONT);
    let exited = tokio::time::timeout_at(deadline, exit_of(child)).await;
    if exited.is_err() {
        child.signal_group(Signal::KILL);
        exit_of(child).await?;
        return Ok(());
    }
    exited??;
    while child.group_alive() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if child.group_alive() {
        child.signal_group(Signal::KILL);
    }
    Ok(())
}

/// Stops what a finished command left running in its process group (children in the
/// background): SIGTERM, then SIGKILL after `--kill-after`. The group's own helpers (the
/// watcher that leads it on flock) do not count; the supervisor, which heads it elsewhere, has
/// exited with the command.
async fn stop_leftovers(args: &RunArgs, child: &Child) {
    if !child.group_alive() {
        return;
    }
    if args.take.verbose && !output::json() {
        eprintln!("xtr-lock: stopping what the command left running in its process group");
    }
    let deadline = Instant::now() + args.kill_after;
    child.signal_group(Signal::TERM);
    child.signal_group(Signal::CONT);
    while child.group_alive() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill_leftovers(child).await;
}

/// SIGKILL for what is left of the command's group, and a wait (at most a second: a process
/// in uninterruptible sleep dies when it wakes) until it is gone.
async fn kill_leftovers(child: &Child) {
    if !child.group_alive() {
        return;
    }
    child.signal_group(Signal::KILL);
    let deadline = Instant::now() + Duration::from_secs(1);
    while child.group_alive() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn exit_of(child: &mut Child) -> Result<Exit> {
    loop {
        if let Event::Exited(exit) = child.wait().await? {
            return Ok(exit);
        }
    }
}
