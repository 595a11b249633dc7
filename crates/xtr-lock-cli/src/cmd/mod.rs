//! One module per subcommand, and what they share: the dispatch of the checked settings, the
//! store closed after a command, taking a lock as `-n`/`-w` say and what is said of it.

pub(crate) mod bench;
pub(crate) mod config;
pub(crate) mod fd;
pub(crate) mod keys;
mod leader;
pub(crate) mod list;
pub(crate) mod migrate;
mod permits;
mod revoke;
pub(crate) mod run;

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::CommandFactory as _;
use serde_json::json;
use xtr_lock::{Lock, Lockable as _, OnConflict, Wait};

use crate::args::{Settings, Take};
use crate::cli::Cli;
use crate::exit::Exit;
use crate::output::{self, StatusLine, mode_name};
use crate::store::StoreConfig;

/// Runs what the command line asked for, on the store it names (opened here, closed after).
pub(crate) async fn dispatch(settings: Settings) -> Result<Exit> {
    match settings {
        Settings::Run(settings) => {
            let store = StoreConfig::open(&settings.source, settings.take.quiet)?;
            store.check_take(&settings.take)?;
            closing(store, |store| run::run(store, settings)).await
        }
        Settings::Acquire {
            source,
            take,
            resource,
            fd: Some(fd),
        } => {
            let store = StoreConfig::open(&source, take.quiet)?;
            closing(store, |store| fd::lock(store, take, resource, fd)).await
        }
        Settings::Acquire {
            source,
            take,
            resource,
            fd: None,
        } => {
            let store = StoreConfig::open(&source, take.quiet)?;
            store.check_take(&take)?;
            closing(store, |store| {
                keys::acquire(store, &source, take, &resource)
            })
            .await
        }
        Settings::Revoke {
            source,
            resource,
            wait,
            json,
        } => {
            let store = StoreConfig::open(&source, json)?;
            closing(store, |store| revoke::revoke(store, resource, wait, json)).await
        }
        Settings::Path { source, resource } => {
            let store = StoreConfig::open(&source, true)?;
            closing(store, |store| async move { fd::path(&store, &resource) }).await
        }
        Settings::Release { source, key } => keys::release(&source, key).await,
        Settings::Refresh { source, ttl, key } => keys::refresh(&source, ttl, key).await,
        looking @ (Settings::Status { .. }
        | Settings::StatusOfKey { .. }
        | Settings::List { .. }
        | Settings::Leader { .. }) => look(looking).await,
        Settings::Bench(settings) => {
            // Measuring a store that locks nothing between processes is a fair question.
            let store = StoreConfig::open(&settings.source, true)?;
            closing(store, |store| bench::bench(store, settings)).await
        }
        Settings::Migrate { source, print } => migrate::migrate(&source, print).await,
        Settings::ConfigCheck {
            file,
            ping,
            verbose,
        } => config::check(&file, ping, verbose).await,
        Settings::ConfigShow { file } => config::show(&file),
        Settings::Completions(shell) => {
            // Written whole, so a reader that stops early (`| head`) ends it quietly.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "xtr-lock", &mut script);
            crate::output::print_bytes(&script)?;
            Ok(Exit::Ok)
        }
    }
}

/// The commands that only look: `status`, `list`, `leader`.
async fn look(settings: Settings) -> Result<Exit> {
    match settings {
        Settings::Status {
            source,
            resource,
            json,
            permits: None,
        } => {
            let store = StoreConfig::open(&source, true)?;
            closing(store, |store| keys::status(store, resource, json)).await
        }
        Settings::Status {
            source,
            resource,
            json,
            permits: Some(permits),
        } => {
            let store = StoreConfig::open(&source, true)?;
            closing(store, |store| {
                permits::status(store, resource, permits, json)
            })
            .await
        }
        Settings::StatusOfKey { source, key, json } => {
            keys::status_of_key(&source, Some(key), json).await
        }
        Settings::List {
            source,
            prefix,
            json,
        } => {
            let store = StoreConfig::open(&source, true)?;
            closing(store, |store| list::list(store, prefix, json)).await
        }
        Settings::Leader {
            source,
            name,
            watch,
            json,
        } => {
            let store = StoreConfig::open(&source, true)?;
            closing(store, |store| leader::leader(store, name, watch, json)).await
        }
        _ => unreachable!("only the commands that look"),
    }
}

/// Runs a command on `store`, then closes the store, whatever the outcome: work it still does in
/// the background (a quorum's slowest members receiving a release) finishes before the process
/// exits, instead of being left to expiry.
async fn closing<F, Fut>(store: StoreConfig, command: F) -> Result<Exit>
where
    F: FnOnce(StoreConfig) -> Fut,
    Fut: std::future::Future<Output = Result<Exit>>,
{
    let handle = store.store.clone();
    let outcome = command(store).await;
    close(&*handle).await;
    outcome
}

/// Closes `store` (within the exit's bound, see [`crate::exit::deadline`]: a quorum's release is
/// confirmed once a majority answered, and its slowest members, a paused server, are not
/// waited for past it); a failure is reported, and does not change the command's exit status
/// (what the command did is done).
pub(crate) async fn close(store: &dyn xtr_lock::Store) {
    let Some(closed) = crate::exit::bounded(store.close()).await else {
        // What is left is still pending: the exit's settle says so.
        return;
    };
    if let Err(err) = closed {
        output::warning(&output::causes(&err));
    }
}

/// Why a lock was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Held by someone else (at once, or still when `-w` ran out).
    Held,
    /// `--on-conflict queue-one`: held, and another run already waits for it.
    Queued,
}

impl Refused {
    /// The `--json` conflict event's `why`.
    fn why(self) -> &'static str {
        match self {
            Refused::Held => "held",
            Refused::Queued => "queued",
        }
    }
}

/// Takes `lock` as `take` says (`--on-conflict`, `-n`, `-w`): `Ok(how long it took)`, or why
/// not. While it waits, a status line on a terminal; a `waiting` line with `-v` elsewhere, or a
/// `waiting` event under `--json`. With `-v`, the store's warnings once (see `preflight`).
pub(crate) async fn take(
    lock: &Lock,
    store: &StoreConfig,
    take: &Take,
) -> Result<std::result::Result<Duration, Refused>> {
    let started = Instant::now();
    // `-v`: the store's set-up checked beside the first attempt, said once taken or waiting.
    let mut preflight = crate::preflight::Preflight::start(&store.store, take.verbose);
    let waits = !(take.wait == Wait::Never || take.wait == Wait::AtMost(Duration::ZERO));
    // Try once before showing anything: most locks are free. Within the wait's deadline: a
    // store that does not answer (a dead database's connect) must not overrun `-w`.
    let first = lock.acquire_with(take.mode, Wait::Never);
    let first = match take.wait {
        Wait::AtMost(d) if waits => match tokio::time::timeout(d, first).await {
            Ok(first) => first,
            Err(_) => anyhow::bail!(
                "lock {:?}: the store did not answer within {d:?} (the wait)",
                lock.resource()
            ),
        },
        _ => first.await,
    };
    match first {
        Ok(true) => {
            let took = started.elapsed();
            preflight.say().await;
            return Ok(Ok(took));
        }
        Ok(false) => {}
        // A store that cannot be reached yet (starting, restarting, a quorum short of
        // members): the wait below rides that out until its deadline, as the library's does.
        Err(err) if waits && err.is_temporary() => {}
        Err(err) => return Err(err.into()),
    }
    if !waits {
        return Ok(Err(Refused::Held));
    }
    preflight.say().await;
    announce_wait(lock, store, take).await;
    let quiet = take.quiet || output::json();
    let _status = StatusLine::start(store.store.clone(), lock.key().clone(), quiet);
    // The wait counts from the start, the first try included.
    let wait = match take.wait {
        Wait::AtMost(d) => Wait::AtMost(d.saturating_sub(started.elapsed())),
        other => other,
    };
    if lock
        .acquire_with_policy(take.mode, wait, take.on_conflict)
        .await?
    {
        return Ok(Ok(started.elapsed()));
    }
    // queue-one gives up at once when another run already waits; a wait that ran out took
    // all of it.
    let queued = take.on_conflict == OnConflict::QueueOne
        && match take.wait {
            Wait::AtMost(d) => started.elapsed() < d,
            _ => true,
        };
    Ok(Err(if queued {
        Refused::Queued
    } else {
        Refused::Held
    }))
}

/// Says `take` waits for `lock`: a `waiting` event under `--json`, a line with `-v` where
/// stderr is no terminal (the terminal's status line says it on its own), with who holds it.
async fn announce_wait(lock: &Lock, store: &StoreConfig, take: &Take) {
    // Asked only when a line or an event will show them (the terminal's status line asks on
    // its own): a wait costs no extra round trip otherwise.
    let json = output::json();
    let verbose_line = take.verbose && !std::io::stderr().is_terminal();
    let holders = if json || verbose_line {
        output::who_holds(store.store.as_ref(), lock.key()).await
    } else {
        None
    };
    if json {
        let list = holders.as_ref().map(|h| output::holders(h));
        output::event(
            "waiting",
            json!({"resource": lock.resource(), "held_by": list,
                   "on_conflict": take.on_conflict.as_str()}),
        );
    } else if verbose_line {
        let by = holders.as_deref().map(output::held_by).unwrap_or_default();
        let how = match take.on_conflict {
            OnConflict::Replace => " (asking its holders to give it up: --on-conflict replace)",
            OnConflict::QueueOne => " (unless another run already waits: --on-conflict queue-one)",
            _ => "",
        };
        eprintln!("xtr-lock: waiting for {:?}{by}{how}", lock.resource());
    }
}

/// Says the lock was not taken: a `conflict` event, or (unless `-q`) a line.
pub(crate) fn say_refused(resource: &str, take: &Take, refused: Refused) {
    if output::json() {
        output::event(
            "conflict",
            json!({"resource": resource, "on_conflict": take.on_conflict.as_str(),
                   "why": refused.why()}),
        );
    } else if !take.quiet {
        eprintln!("{}", conflict_message(resource, take, refused));
    }
}

/// `-v`'s line once the lock is taken, flock(1)'s words with what the lock is:
/// `xtr-lock: getting lock "r" took 0.000123 seconds (write, fencing token 42)`.
pub(crate) fn took_line(lock: &Lock, took: Duration) -> String {
    let permits = lock
        .key()
        .permits()
        .map(|p| format!("{} of {} permits", p.count(), p.limit()));
    let mode = permits
        .as_deref()
        .unwrap_or_else(|| lock.held_mode().map_or("held", mode_name));
    let token = lock
        .fencing_token()
        .map_or_else(String::new, |t| format!(", fencing token {t}"));
    took_line_of(lock.resource(), took, &format!("{mode}{token}"))
}

/// `-v`'s line for `resource`, taken in `took`, with what the lock is (`write, descriptor 9`).
pub(crate) fn took_line_of(resource: &str, took: Duration, what: &str) -> String {
    format!(
        "xtr-lock: getting lock {resource:?} took {:.6} seconds ({what})",
        took.as_secs_f64()
    )
}

/// The message for a lock on `resource` held by someone else (or, with `--limit`, too few of
/// the semaphore's permits free).
pub(crate) fn conflict_message(resource: &str, take: &Take, refused: Refused) -> String {
    if refused == Refused::Queued {
        return format!(
            "xtr-lock: {resource:?} is held by someone else, and another run already waits for \
             it (--on-conflict queue-one)"
        );
    }
    let (now, still) = match take.permits {
        Some(p) => {
            let what = match p.count() {
                1 => format!("no free permit (limit {})", p.limit()),
                n => format!("fewer than {n} free permits (limit {})", p.limit()),
            };
            (format!("has {what}"), format!("still has {what}"))
        }
        None => (
            "is held by someone else".to_owned(),
            "is still held by someone else".to_owned(),
        ),
    };
    match take.wait {
        Wait::AtMost(d) if !d.is_zero() => format!(
            "xtr-lock: {resource:?} {still} after {}",
            crate::output::short(d)
        ),
        _ => format!("xtr-lock: {resource:?} {now}"),
    }
}
