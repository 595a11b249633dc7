//! `xtr-lock`: run commands under locks, hand locks between processes, show holders, benchmark
//! a store. Thin: parse, run, map to an exit code; errors are printed once.

mod cli;
mod cmd;
mod config;
mod exit;
mod lease;
mod output;
mod procs;
mod stdio;
mod trampoline;

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser as _};

use cli::{Cli, Command};
use config::{StoreConfig, Take, duration};
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
    match runtime.block_on(run(cli)) {
        Ok(exit) => ExitCode::from(exit.code()),
        Err(err) => {
            eprintln!("xtr-lock: error: {}", output::causes(err.as_ref()));
            ExitCode::from(exit::ERROR)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Run {
            store,
            wait,
            kill_after,
            resource,
            command,
        } => {
            let take = Take::from_args(&wait)?;
            let kill_after = duration("--kill-after", &kill_after)?;
            let store = StoreConfig::from_args(&store)?;
            closing(store, |store| {
                cmd::run::run(cmd::run::RunArgs {
                    store,
                    take,
                    kill_after,
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
            let take = Take::from_args(&wait)?;
            let store = StoreConfig::from_args(&store)?;
            closing(store, |store| cmd::keys::acquire(store, take, &resource)).await
        }
        Command::Release { store, key } => {
            let store = StoreConfig::from_args(&store)?;
            closing(store, |store| cmd::keys::release(store, key)).await
        }
        Command::Refresh { store, ttl, key } => {
            let ttl = duration("--ttl", &ttl)?;
            let store = StoreConfig::from_args(&store)?;
            closing(store, |store| cmd::keys::refresh(store, ttl, key)).await
        }
        Command::Status {
            store,
            resource,
            key,
            json,
        } => {
            let store = StoreConfig::from_args(&store)?;
            closing(store, |store| cmd::keys::status(store, resource, key, json)).await
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
            let store = StoreConfig::from_args(&store)?;
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

/// Closes `store`; a failure is reported, and does not change the command's exit status (what
/// the command did is done).
async fn close(store: &dyn xtr_lock::Store) {
    if let Err(err) = store.close().await {
        eprintln!("xtr-lock: warning: {}", output::causes(&err));
    }
}
