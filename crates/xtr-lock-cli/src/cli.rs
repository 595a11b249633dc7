//! The command line, as clap sees it. Raw arguments only: `args.rs` turns them into checked
//! settings.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  xtr-lock run nightly-report ./build-report.sh         wait for the lock, run, release
  xtr-lock run -n cron:cleanup -c 'find /tmp -delete'   skip (exit 1) if already running
  xtr-lock run -w 30 --store redis://cache:6379 invoice:42 ./renew.sh
  KEY=$(xtr-lock acquire --store redis://h job:7 --ttl 10m); ...; echo \"$KEY\" | xtr-lock release -
  xtr-lock status nightly-report && echo running
  xtr-lock bench --store flock --clients 8";

/// What `run --help` adds: the command's environment, the ttl, the exit codes, examples.
const RUN_HELP: &str = "\
The command's environment (the caller's own, plus what names the store run used, so that a nested
xtr-lock uses it too: XTR_LOCK_STORE for --store, with its password if it has one; XTR_LOCK_CONFIG
and XTR_LOCK_USE for --config/--use):
  XTR_LOCK_RESOURCE       the resource locked
  XTR_LOCK_MODE           write or read
  XTR_LOCK_FENCING_TOKEN  the lock's fencing token, where the store gives one (Redis): pass it to
                          what the command writes, so a write made after the lock was lost is refused
  XTR_LOCK_SCHEME         the store's kind: flock, redis, combined(...), ...
  XTR_LOCK_LOCATION       where the lock lives: the lock file (flock), the key and server (Redis)

The ttl: on stores where a lock is a lease (Redis), it lasts --ttl (default 60s) and is renewed
every third of it while the command runs, so a crashed xtr-lock frees it within --ttl. Flock
locks need none: they end when the holding processes die. `acquire` has the same default for
the same reason: a key whose holder vanished frees its lock when the ttl runs out.

Examples:
  xtr-lock run backup ./backup.sh                     wait as long as it takes (flock(1) style)
  xtr-lock run -n backup ./backup.sh                  skip if running: exit 1 (cron)
  xtr-lock run -w 30 -E 0 backup ./backup.sh          wait 30 s at most, then skip quietly
  xtr-lock run -s report -c 'cat data/*.csv'          readers together, writers alone
  xtr-lock run --store redis://cache:6379 --ttl 5m deploy ./deploy.sh
  XTR_LOCK_STORE=redis://a:6379,redis://b:6379,redis://c:6379 xtr-lock run job ./job.sh
  xtr-lock run --store redis+pubsub://cache:6379 sync ./sync.sh   freed the instant xtr-lock dies
  xtr-lock run -v --json job ./job.sh 2>events.jsonl  what happened, as JSON lines on stderr";

#[derive(Debug, Parser)]
#[command(
    name = "xtr-lock",
    version,
    about = "Run commands under exclusive or shared locks held in files, Redis, SQL databases, \
etcd, Memcached, SysV semaphores or a quorum of them.",
    long_about = "Run commands under exclusive or shared locks held in files (the default, no server), \
Redis, PostgreSQL, MySQL/MariaDB or SQLite, etcd, Memcached, SysV semaphores, memory, or a quorum \
of stores; hand locks between processes; show who holds them; benchmark a store.\n\n\
Locks made here and by the xtr-lock library, Python xtr-lock and flock(1) (files, Redis), \
portalocker (Redis pub/sub), Symfony Lock (Redis, SQL, Memcached, semaphores) and etcdctl lock \
(etcd) exclude each other.",
    after_help = format!("{EXAMPLES}\n\n{}", crate::exit::TABLE),
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone)]
pub(crate) struct StoreArgs {
    /// Where locks live: flock (the default), flock:///dir, redis://host:6379/0, rediss://…,
    /// unix:///sock, redis+pubsub://host:6379 (a live connection, shared with portalocker),
    /// postgres://, mysql://, mariadb://, sqlite:///path (Symfony's lock table; see
    /// `migrate`), postgresql+advisory://host/db (PostgreSQL advisory locks; ?keys=crc32 for
    /// Symfony's keys), mysql+getlock://host/db (MySQL/MariaDB GET_LOCK), memcached://host:11211
    /// (Symfony's Memcached layout), semaphore (SysV semaphores, shared with PHP's sysvsem),
    /// in-memory, null.
    /// Repeated, or several separated by commas: a quorum (strict majority) over those stores.
    /// Without --store: --config, then $XTR_LOCK_STORE (also a comma-separated list), then
    /// $XTR_LOCK_CONFIG, then flock.
    #[arg(long, value_name = "DSN")]
    pub store: Vec<String>,

    /// A lock configuration file (TOML: named store entries, a prefix, a ttl and a wait; see
    /// `xtr-lock config --help`); the entry --use names, or the file's default, is the store.
    /// Also $XTR_LOCK_CONFIG.
    #[arg(long, value_name = "FILE", conflicts_with = "store")]
    pub config: Option<PathBuf>,

    /// The entry of the configuration file to use (default: the file's `default`; for the
    /// file of $XTR_LOCK_CONFIG, $XTR_LOCK_USE first).
    #[arg(long = "use", value_name = "NAME", conflicts_with = "store")]
    pub use_entry: Option<String>,
}

/// The configuration file of `config check` and `config show`.
#[derive(Debug, Args, Clone)]
pub(crate) struct ConfigFileArgs {
    /// The file (default: $XTR_LOCK_CONFIG).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// What `config --help` adds: the file's shape.
const CONFIG_HELP: &str = "\
The file (TOML); ${VAR} and ${VAR:-default} in DSNs come from the environment:
  prefix = \"billing:\"      # in front of every resource
  ttl = \"5 minutes\"        # lock lifetime where locks expire (\"none\": the CLI keeps 60s)
  wait = \"30s\"             # how long run/acquire wait without -n/-w (\"forever\", \"0\")
  default = \"redis\"        # the entry used without --use (default: \"default\")

  [stores]
  redis = \"redis://:${REDIS_PASSWORD}@cache:6379/0\"
  files = \"flock:///var/lock/billing\"
  quorum = [\"redis://r1:6379\", \"redis://r2:6379\", \"redis://r3:6379\"]
  db = { dsn = \"postgresql+advisory://app:${PGPASSWORD}@db/app\", prefix = \"\", wait = \"0\" }

Flags win over the file: --ttl, -w and -n over its ttl and wait.

Exit codes of check: 0 every entry is sound (and, with --ping, reached), 2 a problem (each on
its own line), 69 an entry could not be reached (--ping).";

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Check every entry: DSNs, variables, periods, the default entry; with --ping also reach
    /// each store (a trying lock on `xtr-lock-ping`, released), for readiness probes.
    Check {
        #[command(flatten)]
        file: ConfigFileArgs,
        /// Also reach every entry's store.
        #[arg(long)]
        ping: bool,
        /// How long each store may take to answer the ping.
        #[arg(long, value_name = "DURATION", default_value = "5s")]
        timeout: String,
    },
    /// Print the configuration as checked: every entry with its stores (credentials redacted),
    /// prefix, ttl and wait.
    Show {
        #[command(flatten)]
        file: ConfigFileArgs,
    },
}

#[derive(Debug, Args, Clone)]
pub(crate) struct WaitArgs {
    /// Fail at once if the lock is held (exit 1, or -E).
    #[arg(
        short = 'n',
        long = "nonblock",
        visible_alias = "nb",
        conflicts_with = "wait"
    )]
    pub nonblock: bool,

    /// Give up after this long if the lock stays held: seconds (30, 0.5) or a duration (2m,
    /// 1h30m, 500ms).
    #[arg(
        short = 'w',
        long = "wait",
        visible_alias = "timeout",
        value_name = "SECONDS"
    )]
    pub wait: Option<String>,

    /// Take a shared (read) lock: readers run together, writers wait.
    #[arg(short = 's', long = "shared", conflicts_with = "exclusive")]
    pub shared: bool,

    /// Take an exclusive (write) lock: the default, as in flock(1).
    #[arg(short = 'x', short_alias = 'e', long = "exclusive")]
    pub exclusive: bool,

    /// The lock's lifetime on stores where locks expire (renewed while the command runs):
    /// seconds or a duration; default 60s.
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
    #[arg(short = 'q', long, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Say how long getting the lock took (and, for run, what is executed), also when stderr
    /// is not a terminal.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Take the lock, run COMMAND, release the lock when it exits; exit with its status.
    ///
    /// COMMAND comes after the resource, with or without `--` (or as -c 'shell command'). It
    /// runs in its own process group while the lock is kept alive and watched. If the lock is
    /// lost (its key deleted, its lock file replaced, its lease run out), the group gets
    /// SIGTERM, then SIGKILL after --kill-after, and xtr-lock exits 3; a lock found lost when
    /// COMMAND ends is exit 3 too. On flock COMMAND inherits the locked file (unless -o), so
    /// the lock lasts while it runs even if xtr-lock is killed (not its whole process group,
    /// which stops COMMAND, as flock(1)'s); elsewhere COMMAND is stopped if
    /// xtr-lock dies, and, where the lock is a lease, before the lease ends if xtr-lock could
    /// not renew it (stopped or starved).
    #[command(after_help = format!("{RUN_HELP}\n\n{}", crate::exit::TABLE))]
    Run {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        wait: WaitArgs,
        /// Grace between SIGTERM and SIGKILL when the command's process group must stop (the
        /// lock was lost, or xtr-lock died on a store where the lock dies with it).
        #[arg(long, value_name = "DURATION", default_value = "10s")]
        kill_after: String,
        /// Run this through `sh -c` instead of a COMMAND given as words.
        #[arg(short = 'c', long = "command", value_name = "SHELL_COMMAND")]
        shell: Option<OsString>,
        /// flock(1)'s --close: COMMAND does not inherit the lock file, so children it leaves
        /// behind do not hold the lock; the lock is then xtr-lock's, and COMMAND is stopped if
        /// xtr-lock dies. Other stores never hand the lock to COMMAND.
        #[arg(short = 'o', long = "close")]
        close: bool,
        /// flock(1)'s --unlock, which drops a lock held on a descriptor; refused (see the
        /// message): xtr-lock releases when COMMAND exits.
        #[arg(short = 'u', long = "unlock", hide = true)]
        unlock: bool,
        /// flock(1)'s --no-fork, which execs COMMAND in flock's place; refused (see the message).
        #[arg(short = 'F', long = "no-fork", hide = true)]
        no_fork: bool,
        /// Report what happens as JSON lines on stderr (waiting, acquired, lost, released,
        /// exit) instead of sentences.
        #[arg(long)]
        json: bool,
        /// The resource to lock (any string).
        resource: String,
        /// The command and its arguments.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "COMMAND"
        )]
        command: Vec<OsString>,
    },
    /// Take a lock and print its key, for `release`/`refresh`/`status --key` in another process.
    ///
    /// The key (one line of JSON) names the store it was made on, with its user name but never
    /// a password, and the lock's fencing token; `release`, `refresh` and `status --key` use
    /// that store unless --store or $XTR_LOCK_STORE names it with its password.
    Acquire {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        wait: WaitArgs,
        /// Lock descriptor N of the calling shell instead of printing a key (flock(1)'s `flock
        /// 9`; the flock store only): open the lock file on it first, exec 9>"$(xtr-lock path
        /// RESOURCE)". The lock lasts until the shell closes it (exec 9>&-) or exits.
        #[arg(long, value_name = "N")]
        fd: Option<i32>,
        /// The resource to lock.
        resource: String,
    },
    /// Print the lock file of RESOURCE on the flock store, for a shell to open and lock:
    /// exec 9>"$(xtr-lock path RESOURCE)"; xtr-lock acquire --fd 9 -n RESOURCE (or flock -n 9).
    Path {
        #[command(flatten)]
        store: StoreArgs,
        /// The resource.
        resource: String,
    },
    /// Release the lock a key (argument or stdin) holds.
    Release {
        #[command(flatten)]
        store: StoreArgs,
        /// The key printed by `acquire`; `-` or absent: read from stdin (an argument is visible
        /// to every user in `ps`).
        key: Option<String>,
    },
    /// Extend the lifetime of the lock a key (argument or stdin) holds.
    Refresh {
        #[command(flatten)]
        store: StoreArgs,
        /// The new lifetime, from now: seconds or a duration.
        #[arg(long, value_name = "DURATION", default_value = "60s")]
        ttl: String,
        /// The key printed by `acquire`; `-` or absent: read from stdin.
        key: Option<String>,
    },
    /// Show whether a resource is held, in which mode, and by whom when the store can tell.
    ///
    /// Exit status: 0 held, 1 free, 2 error or cannot tell (a store that cannot see holders);
    /// with --key: 0 held by that key, 3 not held by it.
    Status {
        #[command(flatten)]
        store: StoreArgs,
        /// The resource (or use --key).
        #[arg(required_unless_present = "key")]
        resource: Option<String>,
        /// Ask about the lock a key printed by `acquire` holds instead (`-`: read it from stdin).
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
    /// Make the tables of SQL stores (postgres://, mysql://, mariadb://, sqlite:///path): the
    /// lock table with Symfony Lock's column types, shared with PHP's PdoStore, and this
    /// library's fencing table. Tables already there are checked and kept as they are.
    Migrate {
        #[command(flatten)]
        store: StoreArgs,
        /// Print the SQL instead of running it (for a migration tool of your own).
        #[arg(long)]
        print: bool,
    },
    /// Check or show a lock configuration file (--config, $XTR_LOCK_CONFIG).
    #[command(after_help = CONFIG_HELP)]
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print a shell completion script.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}
