//! Raw arguments turned into checked settings, with errors that name the flag at fault.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use xtr_lock::store::{CombinedStore, ConsensusStrategy, UnanimousStrategy};
use xtr_lock::{Lock, LockFactory, Mode, Store, StoreFactory, Wait};

use crate::cli::{StoreArgs, WaitArgs};
use crate::file::{self, Configured};

/// Parses a duration naming the flag on error: seconds as flock(1) takes them (`30`, `0.5`), or
/// humantime (`30s`, `2m`, `1h30m`, `500ms`); at most [`MAX_DURATION`](xtr_lock::MAX_DURATION)
/// (3650 days).
pub(crate) fn duration(flag: &str, text: &str) -> Result<Duration> {
    let too_long = || anyhow!("{flag} {text:?} is too long: the longest accepted is 3650days");
    if let Ok(seconds) = text.trim().parse::<f64>() {
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(anyhow!(
                "{flag} {text:?} is not a duration: seconds must be a number of at least 0"
            ));
        }
        let d = Duration::try_from_secs_f64(seconds).map_err(|_| too_long())?;
        return if d > xtr_lock::MAX_DURATION {
            Err(too_long())
        } else {
            Ok(d)
        };
    }
    let d = humantime::parse_duration(text).map_err(|e| {
        anyhow!(
            "{flag} {text:?} is not a duration ({e}); write seconds (30, 0.5) or a duration \
             like 30s, 2m, 1h30m or 500ms"
        )
    })?;
    if d > xtr_lock::MAX_DURATION {
        return Err(too_long());
    }
    Ok(d)
}

/// How to take a lock.
#[derive(Debug, Clone)]
pub(crate) struct Take {
    /// `-n`: [`Wait::Never`]; `-w D`: [`Wait::AtMost`]; neither: [`Wait::Forever`], the same
    /// meanings as in the library.
    pub wait: Wait,
    pub mode: Mode,
    pub ttl: Duration,
    pub conflict_exit_code: u8,
    pub quiet: bool,
    pub verbose: bool,
}

/// The default lifetime on stores where locks expire: renewed while a command runs.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(60);

impl Take {
    /// The flags, else what `source`'s configuration entry says, else the defaults (60s,
    /// forever).
    pub(crate) fn from_args(args: &WaitArgs, source: &Source) -> Result<Take> {
        let configured = match source {
            Source::Config(c) => Some(&**c),
            _ => None,
        };
        let ttl = match (&args.ttl, configured.and_then(|c| c.ttl)) {
            (Some(t), _) => duration("--ttl", t)?,
            (None, Some(ttl)) => ttl,
            (None, None) => DEFAULT_TTL,
        };
        if ttl.is_zero() {
            return Err(anyhow!("--ttl must be more than zero"));
        }
        let wait = match (&args.wait, args.nonblock) {
            (_, true) => Wait::Never,
            (Some(w), false) => Wait::AtMost(duration("--wait", w)?),
            (None, false) => configured.and_then(|c| c.wait).unwrap_or(Wait::Forever),
        };
        crate::output::set_verbose(args.verbose);
        Ok(Take {
            wait,
            mode: if args.shared { Mode::Read } else { Mode::Write },
            ttl,
            conflict_exit_code: args.conflict_exit_code,
            quiet: args.quiet,
            verbose: args.verbose,
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
    /// `$XTR_LOCK_STORE`, `$XTR_LOCK_CONFIG`, flock.
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
        match file::path(None) {
            Some(path) => Ok(Source::Config(Box::new(Configured::open(
                &path, false, None,
            )?))),
            None => Ok(Source::Default),
        }
    }

    pub(crate) fn dsns(&self) -> Vec<String> {
        match self {
            Source::Flag(d) | Source::Env(d) => d.clone(),
            Source::Config(c) => c.checked.dsns.clone(),
            Source::Default => vec!["flock".to_owned()],
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

/// Splits a comma-separated list of DSNs. A comma starts a new DSN only where what follows
/// looks like one (`scheme://`, `scheme:` with no host, or a keyword such as `flock`), so a DSN
/// whose own text holds commas (a list of hosts, an option value) stays whole.
pub(crate) fn split_dsns(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for piece in text.split(',') {
        let piece_trimmed = piece.trim();
        match out.last_mut() {
            Some(last) if !last.is_empty() && !starts_dsn(piece_trimmed) => {
                last.push(',');
                last.push_str(piece);
            }
            _ => out.push(piece_trimmed.to_owned()),
        }
    }
    out.into_iter()
        .map(|d| d.trim().to_owned())
        .filter(|d| !d.is_empty())
        .collect()
}

fn starts_dsn(piece: &str) -> bool {
    const KEYWORDS: &[&str] = &["flock", "in-memory", "null"];
    if KEYWORDS.contains(&piece) {
        return true;
    }
    match piece.split_once(':') {
        Some((scheme, rest)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && (rest.starts_with("//") || scheme.eq_ignore_ascii_case("sqlite"))
        }
        None => false,
    }
}

/// The store a DSN (or a list: a quorum) names. Errors show the scheme only, never the DSN.
pub(crate) struct StoreConfig {
    pub store: Arc<dyn Store>,
    /// What the command may be told about the store: its kind (`flock`, `redis`,
    /// `combined(redis,redis,redis)`).
    pub scheme: String,
    /// Whether a key from this store can be used by another process.
    pub keys_travel: bool,
    /// Where each member keeps its locks, as credential-free DSNs that reach them again
    /// (`redis://h:6379/0?prefix=app%3A`): what a handed-over key names. `None` when a
    /// member's locks cannot be reached from another process (flock, in-memory).
    pub locators: Option<Vec<String>>,
}

impl StoreConfig {
    /// Opens the store `source` names (nothing connects yet). Unless `quiet`, warns about
    /// stores that lock nothing between processes.
    pub(crate) fn open(source: &Source, quiet: bool) -> Result<StoreConfig> {
        let dsns = source.dsns();
        let unanimous = matches!(source, Source::Config(c)
            if c.checked.quorum == Some(xtr_lock::config::QuorumKind::Unanimous));
        let config = StoreConfig::from_members(&dsns, unanimous).with_context(|| match source {
            Source::Flag(d) | Source::Env(d) if d.len() > 1 => {
                format!("{} lists a DSN that names no usable store", source.name())
            }
            _ => format!("{} names no usable store", source.name()),
        })?;
        if !quiet {
            let mut seen: Vec<&str> = Vec::new();
            for dsn in &dsns {
                if seen.contains(&dsn.as_str()) {
                    continue;
                }
                seen.push(dsn);
                let warning = match dsn.as_str() {
                    "in-memory" => {
                        "in-memory locks live in this process only: nothing is locked between \
                         processes (use flock or redis://)"
                    }
                    "null" => "the null store locks nothing: every lock is granted",
                    _ => continue,
                };
                if crate::output::json() {
                    crate::output::event("warning", serde_json::json!({ "message": warning }));
                } else {
                    eprintln!("xtr-lock: warning: {warning}");
                }
            }
        }
        Ok(config)
    }

    pub(crate) fn from_dsns(dsns: &[String]) -> Result<StoreConfig> {
        StoreConfig::from_members(dsns, false)
    }

    /// As [`from_dsns`](Self::from_dsns); a quorum needs every member with `unanimous`.
    pub(crate) fn from_members(dsns: &[String], unanimous: bool) -> Result<StoreConfig> {
        let scheme_of = |dsn: &str| {
            dsn.split_once(':')
                .map_or(dsn, |(s, _)| s)
                .to_ascii_lowercase()
        };
        let members: Vec<Arc<dyn Store>> = dsns
            .iter()
            .map(|dsn| StoreFactory::create_store(dsn))
            .collect::<xtr_lock::Result<_>>()?;
        let locators: Option<Vec<String>> = dsns
            .iter()
            .zip(&members)
            .map(|(dsn, store)| locator(dsn, &**store))
            .collect();
        let in_memory = dsns.iter().any(|d| d == "in-memory");
        let (store, scheme): (Arc<dyn Store>, String) = match members.as_slice() {
            [one] => (one.clone(), scheme_of(&dsns[0])),
            _ => {
                let schemes: Vec<String> = dsns.iter().map(|d| scheme_of(d)).collect();
                let combined = if unanimous {
                    CombinedStore::new(members, UnanimousStrategy)?
                } else {
                    CombinedStore::new(members, ConsensusStrategy)?
                };
                (
                    Arc::new(combined),
                    format!("combined({})", schemes.join(",")),
                )
            }
        };
        // In-memory locks die with this process; flock keys hold an open file.
        let keys_travel = store.capabilities().serializable_keys && !in_memory;
        Ok(StoreConfig {
            store,
            scheme,
            keys_travel,
            locators: locators.filter(|_| keys_travel),
        })
    }

    pub(crate) fn factory(&self) -> LockFactory {
        LockFactory::from_arc(self.store.clone())
    }

    pub(crate) fn lock(&self, resource: &str, ttl: Duration) -> Lock {
        self.factory().create_lock(resource).with_ttl(Some(ttl))
    }
}

/// A credential-free DSN that reaches the locks `store` keeps (built from `dsn`), or `None` if
/// they cannot be reached from another process.
fn locator(dsn: &str, store: &dyn Store) -> Option<String> {
    if dsn == "null" {
        return Some("null".to_owned());
    }
    let shown = store.locks_in()?;
    // Only what the factory can open again: Redis's form is a DSN; flock's and memory's are not.
    StoreFactory::validate(&shown).ok().map(|()| shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_flock_seconds_and_units() {
        assert_eq!(duration("-w", "30").unwrap(), Duration::from_secs(30));
        assert_eq!(duration("-w", "0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("-w", "0").unwrap(), Duration::ZERO);
        assert_eq!(duration("-w", "2m").unwrap(), Duration::from_secs(120));
        let err = duration("-w", "-1").unwrap_err().to_string();
        assert!(err.contains("at least 0"), "{err}");
        let err = duration("--ttl", "1e300").unwrap_err().to_string();
        assert!(err.contains("too long"), "{err}");
        let err = duration("-w", "soon").unwrap_err().to_string();
        assert!(err.starts_with("-w \"soon\" is not a duration"), "{err}");
    }

    #[test]
    fn dsn_lists_split_where_a_dsn_starts() {
        assert_eq!(
            split_dsns("redis://a:1/0, redis://b:2/0,flock"),
            ["redis://a:1/0", "redis://b:2/0", "flock"]
        );
        assert_eq!(
            split_dsns("etcd://h1:2379,h2:2379,redis://c"),
            ["etcd://h1:2379,h2:2379", "redis://c"],
            "a host list stays in its DSN"
        );
        assert_eq!(split_dsns("redis://h?prefix=a,b"), ["redis://h?prefix=a,b"]);
        assert_eq!(split_dsns("flock:///d"), ["flock:///d"]);
        assert_eq!(split_dsns(" , "), Vec::<String>::new());
    }
}
