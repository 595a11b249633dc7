//! The command line, as clap sees it. Raw arguments only: `args.rs` turns them into checked
//! settings.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use clap::{Args, Parser, Subcommand};

/// What `run --help` adds: the command's environment, the ttl (then the stores that give
/// fencing tokens, examples and the exit codes).
const RUN_HELP: &str = "\
The command's environment (the caller's own, plus what names the store run used, so that a nested
xtr-lock uses it too: XTR_LOCK_STORE for --store, with its password if it has one; XTR_LOCK_CONFIG
and XTR_LOCK_USE for --config/--use):
  XTR_LOCK_RESOURCE       the resource, as named (a nested call on the same entry adds its prefix)
  XTR_LOCK_MODE           write or read
  XTR_LOCK_FENCING_TOKEN  the lock's fencing token, where the store gives one (below): pass it to
                          what the command writes, so a write made after the lock was lost is refused
  XTR_LOCK_SCHEME         the store's kind: flock, redis, combined(...), ...
  XTR_LOCK_LOCATION       where the lock lives: the lock file, the key and its server, ...
  XTR_LOCK_LIMIT          with --limit N: N (and XTR_LOCK_PERMITS: the permits taken)

The ttl (5m unless --ttl or the configuration file says otherwise, as in the library): where
locks expire (redis, sql, memcached), the lock lasts that long and `run` renews it every third
of it while the command runs, so a crashed xtr-lock frees it within the ttl; on etcd it is the
ttl of the lease the store keeps alive. Stores whose locks end with their holder (flock,
semaphore, pg-advisory, mysql-getlock, pubsub) use none: a --ttl there is ignored, with a
warning. --ttl none asks for no expiry, which stores whose locks expire refuse.";

#[derive(Debug, Parser)]
#[command(
    name = "xtr-lock",
    version,
    about = crate::help::ABOUT,
    long_about = crate::help::LONG_ABOUT,
    after_help = crate::help::when_shown(crate::help::top_short),
    after_long_help = crate::help::when_shown(crate::help::top_long),
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone, Default)]
pub(crate) struct StoreArgs {
    /// Where locks live, as a DSN (default: flock; a quorum: several)
    #[arg(long, value_name = "DSN", long_help = crate::help::when_shown(crate::help::store_long))]
    pub store: Vec<String>,

    /// A lock configuration file (also $XTR_LOCK_CONFIG)
    ///
    /// TOML: named store entries, a prefix, a ttl and a wait (see `xtr-lock config --help`);
    /// the entry --use names, or the file's default, is the store.
    #[arg(long, value_name = "FILE", conflicts_with = "store")]
    pub config: Option<PathBuf>,

    /// The entry of the configuration file to use (default: the file's `default`; for the
    /// file of $XTR_LOCK_CONFIG, $XTR_LOCK_USE first).
    #[arg(
        long = "use",
        value_name = "NAME",
        conflicts_with = "store",
        hide_short_help = true
    )]
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
  ttl = \"5 minutes\"        # lock lifetime where locks expire (default 5m; \"none\")
  wait = \"30s\"             # how long run/acquire wait (default \"forever\"; \"0\": try once)
  default = \"redis\"        # the entry used without --use (default: \"default\")

  [stores]
  redis = \"redis://:${REDIS_PASSWORD}@cache:6379/0\"
  files = \"flock:///var/lock/billing\"
  quorum = [\"redis://r1:6379\", \"redis://r2:6379\", \"redis://r3:6379\"]
  db = { dsn = \"postgresql+advisory://app:${PGPASSWORD}@db/app\", prefix = \"\", wait = \"0\" }

Flags win over the file: --ttl, -w and -n over its ttl and wait. `config show` prints each
entry's prefix, ttl and wait as commands use them, and where each came from.

Exit codes of check: 0 every entry is sound (and, with --ping, reached), 2 a problem (each on
its own line), 69 an entry could not be reached (--ping).";

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Check every entry (with --ping: reach every store, for readiness probes).
    ///
    /// Checks DSNs, variables, periods and the default entry; with --ping also reaches each
    /// store (a trying lock on `xtr-lock-ping`, released) and checks its server's set-up,
    /// printing a warning for what can drop locks (Redis or Memcached evicting keys, a
    /// replica, replicas a fail-over can promote). Warnings do not change the exit status.
    Check {
        #[command(flatten)]
        file: ConfigFileArgs,
        /// Also reach every entry's store.
        #[arg(long)]
        ping: bool,
        /// How long each store may take to answer the ping.
        #[arg(long, value_name = "DURATION", default_value = "5s")]
        timeout: String,
        /// With --ping, also print the stores' notes (a server without persistence).
        #[arg(short = 'v', long)]
        verbose: bool,
    },
    /// Print every entry as commands use it (credentials redacted).
    ///
    /// Every entry with its stores (credentials redacted), and the prefix, ttl and wait commands
    /// use without --ttl, -w or -n, each saying where it came from: the entry, the file's top
    /// level, or the default (the same as the library's).
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

    /// Wait at most this long for the lock (default: forever)
    ///
    /// Seconds (30, 0.5), a duration (2m, 1h30m, 500ms), or forever (the default, unless the
    /// configuration file says otherwise). 0 tries once, as -n.
    #[arg(
        short = 'w',
        long = "wait",
        visible_alias = "timeout",
        value_name = "SECONDS"
    )]
    pub wait: Option<String>,

    /// If held: skip (-n), wait (the default), queue-one or replace
    ///
    /// skip: exit 1 (or -E) at once. wait: wait for it (forever, or -w). queue-one: wait only
    /// if nobody else already waits for this resource, else exit as skip does (at most one run
    /// buffered behind the current one). replace: ask the current holders to give it up (as
    /// `xtr-lock revoke`; their commands are stopped, exit 3), then take it when they let go
    /// (within -w). -n with another policy, and -w with skip, are refused.
    #[arg(
        long,
        value_name = "POLICY",
        hide_possible_values = true,
        value_parser = clap::builder::PossibleValuesParser::new(crate::policy::POLICIES)
            .try_map(|s| crate::policy::parse(&s))
    )]
    pub on_conflict: Option<xtr_lock::OnConflict>,

    /// Take a shared (read) lock: readers run together, writers wait
    ///
    /// On a store without shared locks (sql, mysql-getlock, memcached, semaphore) the lock
    /// taken is exclusive, and a warning says so.
    #[arg(short = 's', long = "shared", conflicts_with = "exclusive")]
    pub shared: bool,

    /// Take an exclusive (write) lock: the default, as in flock(1).
    #[arg(
        short = 'x',
        short_alias = 'e',
        long = "exclusive",
        hide_short_help = true
    )]
    pub exclusive: bool,

    /// The lock's lifetime where locks expire: 5m (the default), 30s, none
    ///
    /// Seconds or a duration; 5m by default (as in the library and configuration files); none:
    /// no expiry. `run` renews it while the command runs; a lock from `acquire` lasts that long
    /// unless `refresh` extends it. Where locks end with their holder (flock, semaphore,
    /// pg-advisory, mysql-getlock, pubsub) it is not used, and a warning says so.
    #[arg(long, value_name = "DURATION")]
    pub ttl: Option<String>,

    /// Take a permit of a counting semaphore of N instead of the lock: N at once
    ///
    /// At most N holders (commands) at once on RESOURCE, as `consul lock -n N`. Every holder
    /// must use the same N while anybody holds (a different one is refused, naming both). On
    /// stores that count (see docs/semaphores.md); others refuse, saying why.
    #[arg(long, value_name = "N", conflicts_with = "shared")]
    pub limit: Option<u32>,

    /// With --limit: take K of the N permits at once (default 1).
    #[arg(long, value_name = "K", requires = "limit", hide_short_help = true)]
    pub permits: Option<u32>,

    /// Add KEY=VALUE to the holder's metadata (repeatable; KEY= drops a default key)
    ///
    /// The lock carries a JSON object that `status`, `list` and `leader` show: host, pid
    /// (xtr-lock's), cmd (run's command, URL passwords redacted, shortened to fit), id
    /// ($XTR_LOCK_ID). --meta adds keys or overrides these (values are strings); `--meta cmd=`
    /// leaves the command out. The whole object is at most 1024 bytes.
    #[arg(long, value_name = "KEY=VALUE", hide_short_help = true)]
    pub meta: Vec<String>,

    /// Exit code when the lock is held by someone else.
    #[arg(
        short = 'E',
        long = "conflict-exit-code",
        value_name = "N",
        default_value_t = 1,
        hide_short_help = true
    )]
    pub conflict_exit_code: u8,

    /// Print nothing but errors (no warnings either).
    #[arg(short = 'q', long, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Say how long getting the lock took (and, for run, what runs)
    ///
    /// Also when stderr is not a terminal.
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
    #[command(
        after_help = crate::help::RUN_SHORT,
        after_long_help = crate::help::when_shown(|| format!(
            "{RUN_HELP}\n\nStores that give fencing tokens: {}.\nStores with semaphores (--limit N): {}.\n\n{}\n\n{}",
            crate::help::fencing_names(),
            crate::help::counting_names(),
            crate::help::RUN_EXAMPLES,
            crate::exit::TABLE
        )),
    )]
    Run {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        wait: WaitArgs,
        /// Grace between SIGTERM and SIGKILL when the command's process group must stop (the
        /// lock was lost, or xtr-lock died on a store where the lock dies with it).
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "10s",
            hide_short_help = true
        )]
        kill_after: String,
        /// Hold the lock at least this long, even if COMMAND ends sooner
        ///
        /// For jobs started on several machines (cron): a 2 s job holding an hourly lock for
        /// 55m keeps a host whose clock is behind from running it again. Where locks expire
        /// (redis, sql, memcached, etcd) the lock is left to run out on the store's clock and
        /// xtr-lock exits at once; where the lock ends with its holder (flock, session locks,
        /// pubsub, semaphore) xtr-lock stays and holds it until then (SIGINT/SIGTERM: release
        /// at once). The exit status is still the command's.
        #[arg(long, value_name = "DURATION", hide_short_help = true)]
        min_hold: Option<String>,
        /// Hold the lock at most this long: then stop COMMAND, exit 4
        ///
        /// The lock is not renewed past it (but for 15 s of grace to stop the work); COMMAND's
        /// process group gets SIGTERM, then SIGKILL after --kill-after (13s at most), so it is
        /// dead before the lock can run out; --json: a `max-hold` event. A hung job cannot keep
        /// the lock forever. docs/jobs.md: the design, per store.
        #[arg(long, value_name = "DURATION", hide_short_help = true)]
        max_hold: Option<String>,
        /// Run this through `sh -c` instead of COMMAND's words.
        #[arg(short = 'c', long = "command", value_name = "SHELL_COMMAND")]
        shell: Option<OsString>,
        /// flock(1)'s --close: COMMAND does not inherit the lock file, so children it leaves
        /// behind do not hold the lock; the lock is then xtr-lock's, and COMMAND is stopped if
        /// xtr-lock dies. Other stores never hand the lock to COMMAND.
        #[arg(short = 'o', long = "close", hide_short_help = true)]
        close: bool,
        /// flock(1)'s --unlock, which drops a lock held on a descriptor; refused (see the
        /// message): xtr-lock releases when COMMAND exits.
        #[arg(short = 'u', long = "unlock", hide = true)]
        unlock: bool,
        /// flock(1)'s --no-fork, which execs COMMAND in flock's place; refused (see the message).
        #[arg(short = 'F', long = "no-fork", hide = true)]
        no_fork: bool,
        /// Report what happens as JSON lines on stderr
        ///
        /// Events instead of sentences: waiting, acquired (with the ttl and the metadata),
        /// conflict, lost (with why: revoked, expired, ...), max-hold, min-hold, released,
        /// warning, error, exit; with --standby also leading, stopped and backoff.
        #[arg(long)]
        json: bool,
        /// A hot standby: run COMMAND each time the lock is won, until SIGTERM
        ///
        /// Waits for the lock, runs COMMAND while holding it, then releases and waits again,
        /// until SIGINT/SIGTERM.
        /// Each time the command ends or the lock is lost, the lock is released and taken again
        /// (another standby on the same resource may take it first). A command that fails
        /// within 30s of its start waits 1s, 2s, 4s ... up to 60s before the next campaign (a
        /// run of 30s or more, or a success, starts the back-off over). Always waits forever
        /// and takes the exclusive lock: -n, -w, -s and --limit are refused.
        #[arg(long, conflicts_with_all = [
            "nonblock", "wait", "shared", "limit", "on_conflict", "min_hold", "max_hold"
        ])]
        standby: bool,
        /// With --standby: stop after N restarts (N+1 runs), exiting with the last run's status.
        #[arg(long, value_name = "N", requires = "standby", hide_short_help = true)]
        max_restarts: Option<u32>,
        /// The resource to lock (any string).
        resource: String,
        /// The command and its arguments (or -c 'shell command').
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "COMMAND"
        )]
        command: Vec<OsString>,
    },
    /// Take a lock and print its key (for release, refresh and status --key elsewhere).
    ///
    /// The lock is not renewed: it lasts its ttl unless `refresh` extends it. The key (one line
    /// of JSON) names the store it was made on, with its user name but never a password, and the
    /// lock's fencing token; `release`, `refresh` and `status --key` use that store unless
    /// --store or $XTR_LOCK_STORE names it with its password.
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
    /// Ask every holder of RESOURCE to give it up; exit 0 once it is free.
    ///
    /// Holders that watch their lock (`xtr-lock run`, the library's guards, scopes and
    /// keep_alive) see a loss with the reason `revoked`: `run` stops its command (SIGTERM, then
    /// SIGKILL after its --kill-after), releases and exits 3. Prints how many holders were
    /// asked and whether they let go within -w. Holders that cannot be asked (peers: Python,
    /// PHP, flock(1), etcdctl; `acquire`'s keys, which nothing watches) keep it. Exit status: 0
    /// the resource is free, 1 holders remain after -w, 2 error.
    Revoke {
        #[command(flatten)]
        store: StoreArgs,
        /// How long to wait for the holders to let go.
        #[arg(
            short = 'w',
            long = "wait",
            value_name = "SECONDS",
            default_value = "30s"
        )]
        wait: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The resource.
        resource: String,
    },
    /// Print the lock file of RESOURCE on the flock store, for a shell to open and lock.
    ///
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
        /// The new lifetime, from now: seconds or a duration (default 5m, or the entry's ttl).
        #[arg(long, value_name = "DURATION")]
        ttl: Option<String>,
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
        /// Ask about the counting semaphore RESOURCE of N permits (as `run --limit N` takes):
        /// permits used of the limit, and who holds how many.
        #[arg(long, value_name = "N", conflicts_with = "key")]
        limit: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List what is held: resources, holders and their metadata, time held and left.
    ///
    /// Each resource, its mode, its holders with their metadata, how long they held it and
    /// have left, fencing tokens, waiters. One line per resource (with a header on a terminal); --json: one JSON array. Nothing
    /// held: nothing printed (--json: []), exit 0. A store that cannot enumerate its locks
    /// (memcached, a quorum, ...) is an error saying why (exit 2).
    List {
        #[command(flatten)]
        store: StoreArgs,
        /// Only resources whose name starts with PREFIX (after the configuration entry's
        /// prefix).
        prefix: Option<String>,
        /// Print JSON (one array).
        #[arg(long)]
        json: bool,
    },
    /// Show who leads election NAME (the holder of lock NAME), or watch every change.
    ///
    /// The leader is the holder of the lock NAME, as `run --standby NAME` and the library's
    /// Election take it: its value (metadata), term (fencing token) and since when. Exit status: 0 someone leads, 1 nobody leads, 2 error (a store that cannot tell who
    /// holds a lock). --watch: one line (or JSON object) per change, the current leader first,
    /// until SIGINT/SIGTERM (then exit 0).
    Leader {
        #[command(flatten)]
        store: StoreArgs,
        /// The election (a resource name).
        name: String,
        /// Print every change of leader until interrupted.
        #[arg(long)]
        watch: bool,
        /// Print JSON (one object per line).
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
    /// Make the SQL table store's tables (postgres://, mysql://, mariadb://, sqlite://).
    ///
    /// The lock table with Symfony Lock's column types, shared with PHP's PdoStore, and this
    /// library's fencing, holder-record (TABLE_holder: who holds, since when, with what
    /// metadata) and semaphore tables. Tables already there are checked and kept as they are.
    Migrate {
        #[command(flatten)]
        store: StoreArgs,
        /// Print the SQL instead of running it (for a migration tool of your own).
        #[arg(long)]
        print: bool,
    },
    /// Check or show a lock configuration file (--config, $XTR_LOCK_CONFIG).
    #[command(
        after_help = "`xtr-lock config --help`: the file's shape, and check's exit codes.",
        after_long_help = CONFIG_HELP
    )]
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
