//! The command line's arguments turned once into checked [`Settings`], with errors that name
//! the argument at fault: durations, how to take a lock, and where the store comes from
//! ([`Source`]: `--store`, a configuration file's entry, `$XTR_LOCK_STORE` or the default).

use std::ffi::OsString;
use std::time::Duration;

use anyhow::{Result, anyhow};
use xtr_lock::{Mode, OnConflict, Permits, QuorumKind, StoreSpec, Wait};

use crate::cli::{Cli, Command, ConfigCommand, ConfigFileArgs, StoreArgs, WaitArgs};
use crate::command_line::{command_line, refuse_flock_only};
pub(crate) use crate::durations::duration;
use crate::durations::{ttl_arg, wait_arg};
use crate::file::{self, Configured, Origin};
use crate::policy::{self, Holds};

/// What the command line asks for, every argument checked and converted once (ripgrep's
/// `HiArgs`): the store each command names, how to take its lock (ttl, wait), its durations
/// and its output. Built by [`Settings::from_args`]; `cmd::dispatch` runs it.
pub(crate) enum Settings {
    /// `run`: take the lock, run the command, release.
    Run(RunSettings),
    /// `acquire`: take the lock and print its key, or with `fd`, lock that descriptor.
    Acquire {
        source: Source,
        take: Take,
        resource: String,
        fd: Option<crate::cmd::fd::Inherited>,
    },
    /// `revoke`: every holder asked to give the lock up, waiting `wait` for them to.
    Revoke {
        source: Source,
        resource: String,
        wait: Duration,
        json: bool,
    },
    /// `path`: the lock file of a resource on the flock store.
    Path { source: Source, resource: String },
    /// `release`: the key's lock released.
    Release { source: Source, key: Option<String> },
    /// `refresh`: the key's lock given `ttl` more, from now.
    Refresh {
        source: Source,
        ttl: Duration,
        key: Option<String>,
    },
    /// `status RESOURCE`: who holds it.
    Status {
        source: Source,
        resource: String,
        json: bool,
        /// `--limit N`: the semaphore of that name.
        permits: Option<Permits>,
    },
    /// `status --key KEY`: whether that key holds its lock.
    StatusOfKey {
        source: Source,
        key: String,
        json: bool,
    },
    /// `list [PREFIX]`: what is held (the prefix with the entry's in front).
    List {
        source: Source,
        prefix: String,
        json: bool,
    },
    /// `leader NAME`: who leads, once or every change (`watch`).
    Leader {
        source: Source,
        name: String,
        watch: bool,
        json: bool,
    },
    /// `bench`: what the store costs.
    Bench(BenchSettings),
    /// `migrate`: the SQL stores' tables made, or their SQL printed.
    Migrate { source: Source, print: bool },
    /// `config check`, with `ping`: how long each store may take to answer.
    ConfigCheck {
        file: ConfigFileArgs,
        ping: Option<Duration>,
        /// `-v`: the stores' notes too.
        verbose: bool,
    },
    /// `config show`.
    ConfigShow { file: ConfigFileArgs },
    /// `completions`.
    Completions(clap_complete::Shell),
}

/// `run`'s settings.
pub(crate) struct RunSettings {
    pub source: Source,
    pub take: Take,
    pub kill_after: Duration,
    /// `-o`: the command does not inherit the lock's descriptors.
    pub close: bool,
    /// With the configuration entry's prefix.
    pub resource: String,
    /// As the command line named it (the command's `$XTR_LOCK_RESOURCE`: a nested `xtr-lock`
    /// on the same entry adds the prefix again).
    pub named: String,
    pub command: Vec<OsString>,
    /// `--standby [--max-restarts N]`: run again after each end, `N` restarts at most.
    pub standby: Option<Option<u32>>,
    /// `--min-hold`, `--max-hold`.
    pub holds: Holds,
}

/// `bench`'s settings.
pub(crate) struct BenchSettings {
    pub source: Source,
    /// Concurrent clients of the throughput run, and the resources they spread over.
    pub clients: usize,
    pub resources: usize,
    /// How long the throughput run lasts, and each client holds the lock in it.
    pub duration: Duration,
    pub hold: Duration,
    pub json: bool,
}

impl BenchSettings {
    /// The durations first, then the store.
    fn from_args(
        store: &StoreArgs,
        clients: usize,
        resources: usize,
        run_for: &str,
        hold: &str,
        json: bool,
    ) -> Result<BenchSettings> {
        let run_for = duration("--duration", run_for)?;
        let hold = duration("--hold", hold)?;
        Ok(BenchSettings {
            source: Source::of(store)?,
            clients,
            resources,
            duration: run_for,
            hold,
            json,
        })
    }
}

impl Settings {
    /// Converts the command line, in the order its arguments are checked: an error is one line
    /// naming the argument (or the source of the store) at fault. `run --json` is switched on
    /// before anything can fail, so that its errors are events too; `-v` as the wait is read.
    pub(crate) fn from_args(cli: Cli) -> Result<Settings> {
        Ok(match cli.command {
            run @ Command::Run { .. } => Settings::run(run)?,
            Command::Acquire {
                store,
                wait,
                fd,
                resource,
            } => Settings::acquire(&store, &wait, fd, &resource)?,
            Command::Revoke {
                store,
                wait,
                json,
                resource,
            } => Settings::revoke(&store, &wait, json, &resource)?,
            Command::Path { store, resource } => {
                let source = Source::of(&store)?;
                Settings::Path {
                    resource: source.resource(&resource),
                    source,
                }
            }
            Command::Release { store, key } => Settings::Release {
                source: Source::of(&store)?,
                key,
            },
            Command::Refresh { store, ttl, key } => Settings::refresh(&store, ttl, key)?,
            Command::Status {
                store,
                resource,
                key,
                json,
                limit,
            } => Settings::status(
                Source::of(&store)?,
                resource,
                key,
                json,
                permits_arg(limit, None)?,
            ),
            Command::List {
                store,
                prefix,
                json,
            } => Settings::list(&store, prefix, json)?,
            Command::Leader {
                store,
                name,
                watch,
                json,
            } => Settings::leader(&store, &name, watch, json)?,
            Command::Bench {
                store,
                clients,
                resources,
                duration: run_for,
                hold,
                json,
            } => Settings::Bench(BenchSettings::from_args(
                &store, clients, resources, &run_for, &hold, json,
            )?),
            Command::Migrate { store, print } => Settings::Migrate {
                source: Source::of(&store)?,
                print,
            },
            Command::Config { command } => Settings::config(command)?,
            Command::Completions { shell } => Settings::Completions(shell),
        })
    }

    /// `run`: the command, the take (with the holder's metadata), the standby's turns.
    fn run(command: Command) -> Result<Settings> {
        let Command::Run {
            store,
            wait,
            kill_after,
            shell,
            close,
            unlock,
            no_fork,
            json,
            standby,
            max_restarts,
            min_hold,
            max_hold,
            resource,
            command,
        } = command
        else {
            unreachable!("called for run only")
        };
        crate::output::set_json(json);
        refuse_flock_only(unlock, no_fork)?;
        let command = command_line(shell, command, &resource)?;
        let source = Source::of(&store)?;
        let mut take = Take::from_args(&wait, &source)?;
        take.meta = Some(crate::meta::holder_meta(&wait.meta, Some(&command))?);
        take.meta_given = !wait.meta.is_empty();
        if standby {
            // A standby waits for its turn however long, whatever the file says.
            take.wait = Wait::Forever;
        }
        let kill_after = duration("--kill-after", &kill_after)?;
        let holds = Holds::from_flags(min_hold.as_deref(), max_hold.as_deref())?;
        Ok(Settings::Run(RunSettings {
            resource: source.resource(&resource),
            named: resource,
            source,
            take,
            kill_after,
            close,
            command,
            standby: standby.then_some(max_restarts),
            holds,
        }))
    }

    /// `revoke`: `--json` prints its answer as JSON (errors stay lines, as `status`'s).
    fn revoke(store: &StoreArgs, wait: &str, json: bool, resource: &str) -> Result<Settings> {
        let wait = duration("--wait", wait)?;
        let source = Source::of(store)?;
        Ok(Settings::Revoke {
            resource: source.resource(resource),
            source,
            wait,
            json,
        })
    }

    /// `list [PREFIX]`: the prefix as the store names resources (the entry's prefix first).
    fn list(store: &StoreArgs, prefix: Option<String>, json: bool) -> Result<Settings> {
        let source = Source::of(store)?;
        Ok(Settings::List {
            prefix: source.resource(prefix.as_deref().unwrap_or("")),
            source,
            json,
        })
    }

    /// `leader NAME`.
    fn leader(store: &StoreArgs, name: &str, watch: bool, json: bool) -> Result<Settings> {
        let source = Source::of(store)?;
        Ok(Settings::Leader {
            name: source.resource(name),
            source,
            watch,
            json,
        })
    }

    /// `acquire`: with `--fd N`, the caller's descriptor N taken hold of now.
    /// `refresh`: `--ttl`, unless absent: the entry's ttl (as `config show` says), else the
    /// default; never none (a lock cannot be given no expiry after it was taken).
    fn refresh(store: &StoreArgs, ttl: Option<String>, key: Option<String>) -> Result<Settings> {
        let ttl = match ttl {
            Some(text) => Some(ttl_arg(&text)?.ok_or_else(|| {
                anyhow!(
                    "--ttl none: refresh gives a lock more time, and a lock cannot be given no \
                     expiry after it was taken; give a duration"
                )
            })?),
            None => None,
        };
        let source = Source::of(store)?;
        let ttl = ttl.unwrap_or_else(|| match &source {
            Source::Config(c) => c.checked.ttl.unwrap_or(DEFAULT_TTL),
            _ => DEFAULT_TTL,
        });
        Ok(Settings::Refresh { source, ttl, key })
    }

    fn acquire(
        store: &StoreArgs,
        wait: &WaitArgs,
        fd: Option<i32>,
        resource: &str,
    ) -> Result<Settings> {
        let source = Source::of(store)?;
        let mut take = Take::from_args(wait, &source)?;
        if fd.is_some() && matches!(take.on_conflict, OnConflict::QueueOne | OnConflict::Replace) {
            return Err(anyhow!(
                "--fd locks your descriptor with flock(2), as flock(1) does, and --on-conflict \
                 {} needs xtr-lock's own lock: leave out --fd (or use skip or wait)",
                take.on_conflict.as_str()
            ));
        }
        take.meta = Some(crate::meta::holder_meta(&wait.meta, None)?);
        take.meta_given = !wait.meta.is_empty();
        Ok(Settings::Acquire {
            resource: source.resource(resource),
            source,
            take,
            fd: fd.map(crate::cmd::fd::Inherited::take).transpose()?,
        })
    }

    /// `status`: of a key (`--key`), else of the resource clap made sure of.
    fn status(
        source: Source,
        resource: Option<String>,
        key: Option<String>,
        json: bool,
        permits: Option<Permits>,
    ) -> Settings {
        match key {
            Some(key) => Settings::StatusOfKey { source, key, json },
            None => Settings::Status {
                resource: source
                    .resource(&resource.expect("clap requires a resource without --key")),
                source,
                json,
                permits,
            },
        }
    }

    /// `config check` and `config show`.
    fn config(command: ConfigCommand) -> Result<Settings> {
        Ok(match command {
            ConfigCommand::Check {
                file,
                ping,
                timeout,
                verbose,
            } => {
                let timeout = duration("--timeout", &timeout)?;
                Settings::ConfigCheck {
                    file,
                    ping: ping.then_some(timeout),
                    verbose,
                }
            }
            ConfigCommand::Show { file } => Settings::ConfigShow { file },
        })
    }
}

/// How to take a lock.
#[derive(Debug, Clone)]
pub(crate) struct Take {
    /// `-n`: [`Wait::Never`]; `-w D`: [`Wait::AtMost`] (`-w forever`: [`Wait::Forever`]);
    /// neither: the configuration entry's, else [`Wait::Forever`], the same meanings as in the
    /// library. [`Wait::Never`] for `--on-conflict skip`.
    pub wait: Wait,
    /// `--on-conflict` (`-n`: skip; default: wait); `-w` bounds wait, queue-one and replace.
    pub on_conflict: OnConflict,
    pub mode: Mode,
    /// `None`: no expiry (`--ttl none`, a file's `ttl = "none"`).
    pub ttl: Option<Duration>,
    /// Whether the ttl was asked for (`--ttl`, the file), or is the default.
    pub ttl_from: Origin,
    pub conflict_exit_code: u8,
    pub quiet: bool,
    pub verbose: bool,
    /// `--limit N [--permits K]`: a semaphore's permits instead of the lock.
    pub permits: Option<Permits>,
    /// The holder's metadata (`crate::meta`), checked against the cap.
    pub meta: Option<Vec<u8>>,
    /// Whether `--meta` was given (the default metadata goes unsaid where it is not kept).
    pub meta_given: bool,
}

/// The lifetime of a lock on stores where locks expire, unless `--ttl` or the file says
/// otherwise: the library's, which configuration files also default to.
pub(crate) const DEFAULT_TTL: Duration = xtr_lock::DEFAULT_TTL;

impl Take {
    /// The flags, else what `source`'s configuration entry says, else the defaults (5m,
    /// forever), which are the library's and the file's.
    pub(crate) fn from_args(args: &WaitArgs, source: &Source) -> Result<Take> {
        let configured = match source {
            Source::Config(c) => Some(&**c),
            _ => None,
        };
        let (ttl, ttl_from) = match (&args.ttl, configured) {
            (Some(t), _) => (ttl_arg(t)?, Origin::Flag),
            (None, Some(c)) => (c.checked.ttl, c.origins.ttl),
            (None, None) => (Some(DEFAULT_TTL), Origin::Default),
        };
        let on_conflict =
            policy::on_conflict(args.on_conflict, args.nonblock, args.wait.as_deref())?;
        policy::check_with_limit(on_conflict, args.limit)?;
        let wait = match (&args.wait, on_conflict) {
            (_, OnConflict::Skip) => Wait::Never,
            (Some(w), _) => wait_arg(w)?,
            (None, _) => configured.map_or(Wait::Forever, |c| c.checked.wait),
        };
        crate::output::set_verbose(args.verbose);
        Ok(Take {
            wait,
            on_conflict,
            mode: if args.shared { Mode::Read } else { Mode::Write },
            ttl,
            ttl_from,
            conflict_exit_code: args.conflict_exit_code,
            quiet: args.quiet,
            verbose: args.verbose,
            permits: permits_arg(args.limit, args.permits)?,
            meta: None,
            meta_given: false,
        })
    }
}

/// Where the DSNs came from: a key handed in may override the environment, never a flag.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// `--store`.
    Flag(Vec<String>),
    /// `$XTR_LOCK_STORE`.
    Env(Vec<String>),
    /// An entry of a configuration file (`--config`, `--use`, `$XTR_LOCK_CONFIG`).
    Config(Box<Configured>),
    /// None of them: `flock`.
    Default,
}

/// The environment variable the store is read from when `--store` is absent.
pub(crate) const STORE_ENV: &str = "XTR_LOCK_STORE";

impl Source {
    /// The first of: `--store`, `--config` (or `--use` with `$XTR_LOCK_CONFIG`),
    /// `$XTR_LOCK_STORE`, `$XTR_LOCK_CONFIG` (its entry `$XTR_LOCK_USE`, else its default), flock.
    pub(crate) fn of(args: &StoreArgs) -> Result<Source> {
        if !args.store.is_empty() {
            let dsns: Vec<String> = args.store.iter().flat_map(|s| split_dsns(s)).collect();
            if dsns.is_empty() {
                return Err(anyhow!("--store is empty"));
            }
            return Ok(Source::Flag(dsns));
        }
        let entry = args.use_entry.as_deref();
        if args.config.is_some() || entry.is_some() {
            let Some(path) = file::path(args.config.as_deref()) else {
                return Err(anyhow!(
                    "--use picks an entry of a lock configuration file: give --config FILE or \
                     set ${}",
                    file::CONFIG_ENV
                ));
            };
            return Ok(Source::Config(Box::new(Configured::open(
                &path, true, entry,
            )?)));
        }
        match std::env::var(STORE_ENV) {
            Ok(text) if !text.trim().is_empty() => return Ok(Source::Env(split_dsns(&text))),
            Ok(_) | Err(std::env::VarError::NotPresent) => {}
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(anyhow!("${STORE_ENV} is not valid UTF-8"));
            }
        }
        let entry = file::entry_from_env()?;
        match (file::path(None), entry) {
            (Some(path), entry) => Ok(Source::Config(Box::new(Configured::open(
                &path,
                false,
                entry.as_deref(),
            )?))),
            (None, Some(_)) => Err(anyhow!(
                "${} names an entry of a lock configuration file, and ${} names none",
                file::USE_ENV,
                file::CONFIG_ENV
            )),
            (None, None) => Ok(Source::Default),
        }
    }

    /// What `run`'s command gets in its environment so that a nested `xtr-lock` finds this
    /// store (each variable set, or removed with `None`): `--store`'s DSNs as
    /// `$XTR_LOCK_STORE`, a password included (the command line showed it already; the
    /// environment is readable by the same user only); a configuration entry as
    /// `$XTR_LOCK_CONFIG` (absolute: the command may change directory) and `$XTR_LOCK_USE`,
    /// without `$XTR_LOCK_STORE`, which would win over them. A store the environment named, or
    /// the default, is found again as it was.
    pub(crate) fn nested_environment(&self) -> Vec<(&'static str, Option<OsString>)> {
        match self {
            Source::Flag(dsns) => vec![(STORE_ENV, Some(dsns.join(",").into()))],
            Source::Config(c) => {
                let path = std::path::absolute(&c.path).unwrap_or_else(|_| c.path.clone());
                vec![
                    (STORE_ENV, None),
                    (file::CONFIG_ENV, Some(path.into_os_string())),
                    (file::USE_ENV, Some(c.entry.clone().into())),
                ]
            }
            Source::Env(_) | Source::Default => Vec::new(),
        }
    }

    /// The store it names: one DSN, or a quorum (by consensus, unless its entry says otherwise).
    pub(crate) fn spec(&self) -> StoreSpec {
        match self {
            Source::Flag(d) | Source::Env(d) => {
                StoreSpec::members(d.clone(), QuorumKind::Consensus)
            }
            Source::Config(c) => c.checked.store.clone(),
            Source::Default => StoreSpec::one("flock"),
        }
    }

    /// Whether the command line named the store (`--store`, `--config`, `--use`), rather than
    /// the environment or the default.
    pub(crate) fn explicit(&self) -> bool {
        match self {
            Source::Flag(_) => true,
            Source::Config(c) => c.explicit,
            Source::Env(_) | Source::Default => false,
        }
    }

    /// The resource a command locks: with a configuration entry's prefix in front.
    pub(crate) fn resource(&self, resource: &str) -> String {
        match self {
            Source::Config(c) => format!("{}{resource}", c.checked.prefix),
            _ => resource.to_owned(),
        }
    }

    /// How the source is named in messages.
    pub(crate) fn name(&self) -> String {
        match self {
            Source::Flag(_) => "--store".to_owned(),
            Source::Env(_) => format!("${STORE_ENV}"),
            Source::Config(c) => format!("entry {:?} of {}", c.entry, c.path.display()),
            Source::Default => "the default store (flock)".to_owned(),
        }
    }
}

/// Splits a comma-separated list of DSNs (see [`StoreSpec::parse_list`]).
fn split_dsns(text: &str) -> Vec<String> {
    StoreSpec::parse_list(text).dsns().to_vec()
}

/// `--limit N [--permits K]`, checked as the library checks them.
fn permits_arg(limit: Option<u32>, count: Option<u32>) -> Result<Option<Permits>> {
    limit
        .map(|n| Permits::new(n, count.unwrap_or(1)))
        .transpose()
        .map_err(|e| {
            anyhow!(
                "--limit/--permits: {}",
                e.reason().unwrap_or("out of range")
            )
        })
}
