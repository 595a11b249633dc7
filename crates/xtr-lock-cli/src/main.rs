//! `xtr-lock`: run commands under locks, hand locks between processes, show holders, benchmark
//! a store. Thin: parse, run, map to an exit code; errors are printed once.

mod args;
mod cli;
mod cmd;
mod exit;
mod file;
mod handoff;
mod lease;
mod output;
mod procs;
mod stdio;
mod trampoline;

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser as _};

use args::{Source, StoreConfig, Take, duration};
use cli::{Cli, Command};
use exit::Exit;

fn main() -> ExitCode {
    if let Some(code) = trampoline::run_if_asked() {
        return code; // started by `run` to become its command, and could not
    }
    let cli = Cli::parse(); // usage errors: clap prints them and exits 2
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("xtr-lock: error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(exit) => exit.code(),
        Err(err) => {
            output::error_line(&output::causes(err.as_ref()));
            exit::ERROR
        }
    };
    runtime.block_on(settle());
    if output::json() {
        output::event("exit", serde_json::json!({ "code": code }));
    }
    ExitCode::from(code)
}

/// Lets the store calls still running finish before the runtime (and they with it) is dropped;
/// says so with -v (or --json) when the bound is hit.
async fn settle() {
    let left = exit::deadline().saturating_duration_since(std::time::Instant::now());
    if xtr_lock::settle(left).await {
        return;
    }
    if output::json() {
        output::event(
            "unsettled",
            serde_json::json!({ "waited_ms": exit::SETTLE.as_millis() as u64 }),
        );
    } else if output::verbose() {
        eprintln!(
            "xtr-lock: store calls of this process (clean-ups) still running after {:?}; \
             exiting without them (a lock they would have released is held until its ttl ends)",
            exit::SETTLE
        );
    }
}

async fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Run {
            store,
            wait,
            kill_after,
            shell,
            close,
            unlock,
            json,
            resource,
            command,
        } => {
            output::set_json(json);
            if unlock {
                return Err(anyhow::anyhow!(
                    "-u/--unlock drops a lock held on a descriptor (flock -u FD), and xtr-lock \
                     holds none for you: `run` releases when the command exits, and a lock \
                     taken with `xtr-lock acquire` is released with `xtr-lock release KEY`"
                ));
            }
            let command = match (shell, command.is_empty()) {
                (Some(line), true) => vec!["sh".into(), "-c".into(), line],
                (Some(_), false) => {
                    return Err(anyhow::anyhow!(
                        "give the command either as words after the resource or as -c 'shell \
                         command', not both"
                    ));
                }
                (None, false) => command,
                (None, true) => {
                    return Err(anyhow::anyhow!(
                        "no command to run: give it after the resource (xtr-lock run {resource:?} \
                         ./job.sh) or as -c 'shell command'"
                    ));
                }
            };
            let source = Source::of(&store)?;
            let take = Take::from_args(&wait, &source)?;
            let kill_after = duration("--kill-after", &kill_after)?;
            let resource = source.resource(&resource);
            let store = StoreConfig::open(&source, take.quiet)?;
            closing(store, |store| {
                cmd::run::run(cmd::run::RunArgs {
                    store,
                    take,
                    kill_after,
                    close,
                    resource,
                    command,
                })
            })
            .await
        }
        Command::Acquire {
            store,
            wait,
            resource,
        } => {
            let source = Source::of(&store)?;
            let take = Take::from_args(&wait, &source)?;
            let resource = source.resource(&resource);
            let store = StoreConfig::open(&source, take.quiet)?;
            closing(store, |store| {
                cmd::keys::acquire(store, &source, take, &resource)
            })
            .await
        }
        Command::Release { store, key } => cmd::keys::release(&Source::of(&store)?, key).await,
        Command::Refresh { store, ttl, key } => {
            let ttl = duration("--ttl", &ttl)?;
            if ttl.is_zero() {
                return Err(anyhow::anyhow!("--ttl must be more than zero"));
            }
            cmd::keys::refresh(&Source::of(&store)?, ttl, key).await
        }
        Command::Status {
            store,
            resource,
            key,
            json,
        } => {
            let source = Source::of(&store)?;
            if key.is_some() {
                return cmd::keys::status_of_key(&source, key, json).await;
            }
            let resource =
                source.resource(&resource.expect("clap requires a resource without --key"));
            let store = StoreConfig::open(&source, true)?;
            closing(store, |store| cmd::keys::status(store, resource, json)).await
        }
        Command::Bench {
            store,
            clients,
            resources,
            duration: d,
            hold,
            json,
        } => {
            let run_for = duration("--duration", &d)?;
            let hold = duration("--hold", &hold)?;
            // Measuring a store that locks nothing between processes is a fair question.
            let store = StoreConfig::open(&Source::of(&store)?, true)?;
            closing(store, |store| {
                cmd::bench::bench(cmd::bench::BenchArgs {
                    duration: run_for,
                    hold,
                    store,
                    clients,
                    resources,
                    json,
                })
            })
            .await
        }
        Command::Migrate { store, print } => {
            cmd::migrate::migrate(&Source::of(&store)?, print).await
        }
        Command::Config { command } => cmd::config::config(command).await,
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "xtr-lock",
                &mut std::io::stdout(),
            );
            Ok(Exit::Ok)
        }
    }
}

/// Runs a command on `store`, then closes the store, whatever the outcome: work it still does in
/// the background (a quorum's slowest members receiving a release) finishes before the process
/// exits, instead of being left to expiry.
async fn closing<F, Fut>(store: StoreConfig, command: F) -> anyhow::Result<Exit>
where
    F: FnOnce(StoreConfig) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Exit>>,
{
    let handle = store.store.clone();
    let outcome = command(store).await;
    close(&*handle).await;
    outcome
}

/// Closes `store` (within the exit's bound, see [`exit::deadline`]: a quorum's release is
/// confirmed once a majority answered, and its slowest members, a paused server, are not
/// waited for past it); a failure is reported, and does not change the command's exit status
/// (what the command did is done).
pub(crate) async fn close(store: &dyn xtr_lock::Store) {
    let Some(closed) = exit::bounded(store.close()).await else {
        // What is left is still pending: the exit's settle says so.
        return;
    };
    if let Err(err) = closed {
        let line = output::causes(&err);
        if output::json() {
            output::event("warning", serde_json::json!({"message": line}));
        } else {
            eprintln!("xtr-lock: warning: {line}");
        }
    }
}
