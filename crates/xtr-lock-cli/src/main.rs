//! `xtr-lock`: run commands under locks, hand locks between processes, show holders, benchmark
//! a store. Thin, as ripgrep's: parse (clap), convert once into checked settings
//! ([`args::Settings`]), dispatch to `cmd::*`, map the outcome to an exit code; errors are
//! printed once.

mod args;
mod cli;
mod cmd;
mod command_line;
mod durations;
mod exit;
mod file;
mod fork;
mod handoff;
mod help;
mod helper;
mod lease;
mod meta;
mod output;
mod policy;
mod preflight;
mod procs;
mod sentinel;
mod stdio;
mod store;
mod trampoline;
mod watch;

use std::process::ExitCode;

use clap::Parser as _;

use args::Settings;
use cli::Cli;

fn main() -> ExitCode {
    if let Some(code) = trampoline::run_if_asked() {
        return code; // started by `run` to become its command, and could not
    }
    if let Some(code) = sentinel::run_if_asked() {
        return code; // started by `run` to stand for its process group, or to watch it
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "run") {
        // While this is the only thread, and before parsing dirties the heap that the fork
        // shares: the helper `run` may need, forked now, told later (see `helper`).
        if let Some(code) = helper::prefork() {
            return code; // the helper, its role over
        }
    }
    help::make_texts_only_if_asked(std::env::args_os().skip(1));
    let cli = Cli::parse(); // usage errors: clap prints them and exits 2
    // Before the runtime opens descriptors of its own: `acquire --fd N` takes hold of the
    // caller's descriptor N before a number the caller left free can be reused here.
    let settings = Settings::from_args(cli);
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
    let outcome = runtime.block_on(async { cmd::dispatch(settings?).await });
    let code = match outcome {
        Ok(exit) => exit.code(),
        Err(err) => {
            output::error_line(&output::causes(err.as_ref()));
            exit::ERROR
        }
    };
    runtime.block_on(exit::settle());
    if output::json() {
        output::event("exit", serde_json::json!({ "code": code }));
    }
    ExitCode::from(code)
}
