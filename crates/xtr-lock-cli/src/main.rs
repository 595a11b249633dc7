//! `xtr-lock`: run commands under locks, hand locks between processes, show holders, benchmark
//! a store. Thin: parse, run, map to an exit code; errors are printed once.

mod cli;
mod cmd;
mod config;
mod exit;
mod output;

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser as _};

use cli::{Cli, Command};
use config::{StoreConfig, Wait, duration};
use exit::Exit;

fn main() -> ExitCode {
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
            eprintln!("xtr-lock: error: {err:#}");
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
            let wait = Wait::from_args(&wait)?;
            let kill_after = duration("--kill-after", &kill_after)?;
            let store = StoreConfig::from_args(&store)?;
            cmd::run::run(cmd::run::RunArgs {
                store,
                wait,
                kill_after,
                resource,
                command,
            })
            .await
        }
        Command::Acquire {
            store,
            wait,
            resource,
        } => {
            let wait = Wait::from_args(&wait)?;
            cmd::keys::acquire(StoreConfig::from_args(&store)?, wait, &resource).await
        }
        Command::Release { store, key } => {
            cmd::keys::release(StoreConfig::from_args(&store)?, key).await
        }
        Command::Refresh { store, ttl, key } => {
            let ttl = duration("--ttl", &ttl)?;
            cmd::keys::refresh(StoreConfig::from_args(&store)?, ttl, key).await
        }
        Command::Status {
            store,
            resource,
            key,
            json,
        } => cmd::keys::status(StoreConfig::from_args(&store)?, resource, key, json).await,
        Command::Bench {
            store,
            clients,
            resources,
            duration: d,
            hold,
            json,
        } => {
            let args = cmd::bench::BenchArgs {
                duration: duration("--duration", &d)?,
                hold: duration("--hold", &hold)?,
                store: StoreConfig::from_args(&store)?,
                clients,
                resources,
                json,
            };
            cmd::bench::bench(args).await
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
