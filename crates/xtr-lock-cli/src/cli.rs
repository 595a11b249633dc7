//! The command line, as clap sees it. Raw arguments only: `config.rs` turns them into checked
//! settings.

use std::ffi::OsString;

use clap::{Args, Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  xtr-lock run nightly-report -- ./build-report.sh      wait for the lock, run, release
  xtr-lock run -n cron:cleanup -- ./cleanup.sh          skip (exit 1) if already running
  xtr-lock run -w 30s --store redis://cache:6379 invoice:42 -- ./renew.sh
  KEY=$(xtr-lock acquire --store redis://h job:7 --ttl 10m); ...; xtr-lock release \"$KEY\"
  xtr-lock status nightly-report
  xtr-lock bench --store flock --clients 8";

#[derive(Debug, Parser)]
#[command(
    name = "xtr-lock",
    version,
    about = "Run commands under exclusive or shared locks held in files, Redis or memory.",
    long_about = "Run commands under exclusive or shared locks held in files (the default, no server), \
Redis, or memory; hand locks between processes; show who holds them; benchmark a store.\n\n\
Locks made here and by the xtr-lock library, Python xtr-lock and flock(1) (files) or Symfony \
Lock (Redis) exclude each other.",
    after_help = format!("{EXAMPLES}\n\n{}", crate::exit::TABLE),
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone)]
pub(crate) struct StoreArgs {
    /// Where locks live: flock, flock:///dir, redis://host:6379/0, rediss://…, unix:///sock,
    /// in-memory, null. Repeated: a quorum (strict majority) over those stores.
    #[arg(
        long,
        env = "XTR_LOCK_STORE",
        default_value = "flock",
        value_name = "DSN"
    )]
    pub store: Vec<String>,
}

#[derive(Debug, Args, Clone)]
pub(crate) struct WaitArgs {
    /// Fail at once if the lock is held (exit 1, or -E).
    #[arg(short = 'n', long = "nonblock", conflicts_with = "wait")]
    pub nonblock: bool,

    /// Give up after this long if the lock stays held (30s, 2m, 1h30m).
    #[arg(short = 'w', long = "wait", value_name = "DURATION")]
    pub wait: Option<String>,

    /// Take a shared (read) lock: readers run together, writers wait.
    #[arg(short = 's', long = "shared")]
    pub shared: bool,

    /// The lock's lifetime on stores where locks expire (renewed while the command runs).
    #[arg(long, value_name = "DURATION")]
    pub ttl: Option<String>,

    /// Exit code when the lock is held by someone else.
    #[arg(
        short = 'E',
        long = "conflict-exit-code",
        value_name = "N",
        default_value_t = 1
    )]
    pub conflict_exit_code: u8,

    /// Print nothing but errors.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Take the lock, run COMMAND, release the lock when it exits; exit with its status.
    ///
    /// COMMAND runs in its own process group while the lock is kept alive and watched. If the
    /// lock is lost (its key deleted, its lock file replaced, its lease run out), the group gets
    /// SIGTERM, then SIGKILL after --kill-after, and xtr-lock exits 3; a lock found lost when
    /// COMMAND ends is exit 3 too. On flock COMMAND inherits the locked file, so the lock lasts
    /// while it runs even if xtr-lock is killed; elsewhere COMMAND is stopped if xtr-lock dies,
    /// and, where the lock is a lease, before the lease ends if xtr-lock could not renew it
    /// (stopped or starved).
    Run {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        wait: WaitArgs,
        /// Grace between SIGTERM and SIGKILL when the command's process group must stop (the
        /// lock was lost, or xtr-lock died on a store where the lock dies with it).
        #[arg(long, value_name = "DURATION", default_value = "10s")]
        kill_after: String,
        /// The resource to lock (any string).
        resource: String,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<OsString>,
    },
    /// Take a lock and print its key, for `release`/`refresh`/`status --key` in another process.
    Acquire {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        wait: WaitArgs,
        /// The resource to lock.
        resource: String,
    },
    /// Release the lock a key (argument or stdin) holds.
    Release {
        #[command(flatten)]
        store: StoreArgs,
        /// The key printed by `acquire`; read from stdin when absent.
        key: Option<String>,
    },
    /// Extend the lifetime of the lock a key (argument or stdin) holds.
    Refresh {
        #[command(flatten)]
        store: StoreArgs,
        /// The new lifetime, from now.
        #[arg(long, value_name = "DURATION", default_value = "60s")]
        ttl: String,
        /// The key printed by `acquire`; read from stdin when absent.
        key: Option<String>,
    },
    /// Show whether a resource is held, in which mode, and by whom when the store can tell.
    Status {
        #[command(flatten)]
        store: StoreArgs,
        /// The resource (or use --key).
        #[arg(required_unless_present = "key")]
        resource: Option<String>,
        /// Ask about the lock a key printed by `acquire` holds instead.
        #[arg(long, value_name = "KEY", conflicts_with = "resource")]
        key: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure a store: uncontended latency, hand-off latency, throughput.
    Bench {
        #[command(flatten)]
        store: StoreArgs,
        /// Concurrent clients for the throughput run.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Resources they spread over.
        #[arg(long, default_value_t = 8)]
        resources: usize,
        /// How long the throughput run lasts.
        #[arg(long, default_value = "3s", value_name = "DURATION")]
        duration: String,
        /// How long each client holds the lock in the throughput run.
        #[arg(long, default_value = "0s", value_name = "DURATION")]
        hold: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}
