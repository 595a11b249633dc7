//! [`LocksConfig::check`]: every entry validated, every problem reported at once.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::expand::{Problem, expand};
use super::{DEFAULT_ENTRY, Entry, EntryTable, LocksConfig, Period};
use crate::error::Error;
use crate::lock::lockable::Wait;
use crate::store_factory::{QuorumKind, StoreFactory, StoreKind, StoreSpec};

/// A configuration whose every entry was checked: DSNs expanded and accepted by a store of this
/// build, periods parsed.
#[derive(Debug, Clone)]
pub struct CheckedConfig {
    /// The entry used when none is named.
    pub default: String,
    /// The entries, by name.
    pub entries: BTreeMap<String, CheckedEntry>,
}

/// One checked entry. Its DSNs (which may hold credentials) are shown by `Debug` as their
/// schemes only (a [`StoreSpec`]'s `Debug`).
#[derive(Debug, Clone)]
pub struct CheckedEntry {
    /// The store: one DSN or a quorum, variables expanded.
    pub store: StoreSpec,
    /// Put in front of every resource.
    pub prefix: String,
    /// The ttl locks get (`None`: no ttl).
    pub ttl: Option<Duration>,
    /// How long `run` and `lock` wait.
    pub wait: Wait,
}

/// Every problem a configuration has, one line each, naming the entry (and the variable), never
/// a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    /// The problems, in the order of the entries.
    pub problems: Vec<String>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problems.join("\n"))
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigErrors> for Error {
    fn from(e: ConfigErrors) -> Error {
        Error::invalid_argument(format!(
            "the lock configuration has {} problem{}: {}",
            e.problems.len(),
            if e.problems.len() == 1 { "" } else { "s" },
            e.problems.join("; ")
        ))
    }
}

impl LocksConfig {
    /// Checks every entry with the process's environment: each DSN's `${VAR}`s are set, its
    /// scheme names a store and (when this build has that store) the store accepts it, periods
    /// parse, the default entry exists. Connects to nothing.
    ///
    /// An entry whose store this build lacks (a `postgres://` entry in an application built
    /// without `sql`) is not a problem: a shared file names stores some applications never use.
    /// Using it fails ([`Unsupported`](crate::ErrorKind::Unsupported), naming the feature);
    /// [`CheckedEntry::missing_features`] tells beforehand.
    ///
    /// # Errors
    ///
    /// [`ConfigErrors`] with every problem found, one line each.
    pub fn check(&self) -> Result<CheckedConfig, ConfigErrors> {
        self.check_with(&|name| std::env::var(name).ok())
    }

    /// As [`check`](Self::check), with variables looked up by `env` (for tests, or a
    /// configuration system of your own).
    ///
    /// # Errors
    ///
    /// [`ConfigErrors`] with every problem found, one line each.
    pub fn check_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<CheckedConfig, ConfigErrors> {
        let mut problems = Vec::new();
        let top = Defaults {
            ttl: self.ttl.as_ref().and_then(|p| {
                ttl(p)
                    .map_err(|why| problems.push(format!("ttl: {why}")))
                    .ok()
            }),
            wait: self.wait.as_ref().and_then(|p| {
                wait(p)
                    .map_err(|why| problems.push(format!("wait: {why}")))
                    .ok()
            }),
            prefix: self.prefix.as_deref(),
        };
        let default_stores;
        let stores = if self.stores.is_empty() {
            default_stores =
                BTreeMap::from([(DEFAULT_ENTRY.to_owned(), Entry::Dsn("flock".to_owned()))]);
            &default_stores
        } else {
            &self.stores
        };
        let mut entries = BTreeMap::new();
        for (name, entry) in stores {
            if name.is_empty() {
                problems.push("stores: an entry has an empty name".to_owned());
                continue;
            }
            let before = problems.len();
            let checked = check_entry(name, entry, &top, env, &mut problems);
            if problems.len() == before {
                entries.insert(name.clone(), checked);
            }
        }
        let default = self
            .default
            .clone()
            .unwrap_or_else(|| DEFAULT_ENTRY.to_owned());
        if !stores.contains_key(&default) {
            let names: Vec<&str> = stores.keys().map(String::as_str).collect();
            problems.push(format!(
                "default: no entry named {default:?} (the entries: {})",
                names.join(", ")
            ));
        }
        if problems.is_empty() {
            Ok(CheckedConfig { default, entries })
        } else {
            Err(ConfigErrors { problems })
        }
    }
}

/// What the top level gives every entry that does not say otherwise.
struct Defaults<'c> {
    /// `None`: not given (the library's default applies); `Some(None)`: no ttl.
    ttl: Option<Option<Duration>>,
    wait: Option<Wait>,
    prefix: Option<&'c str>,
}

/// One entry checked; its problems are pushed onto `problems` (the entry is used only if none were).
fn check_entry(
    name: &str,
    entry: &Entry,
    top: &Defaults<'_>,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<String>,
) -> CheckedEntry {
    let at = format!("stores.{name}");
    let (dsns, quorum, table) = entry_stores(&at, entry, problems);
    let expanded = expand_all(&at, &dsns, quorum.is_some(), env, problems);
    let ttl = match table.and_then(|t| t.ttl.as_ref()) {
        Some(p) => ttl(p)
            .map_err(|why| problems.push(format!("{at}.ttl: {why}")))
            .unwrap_or(None),
        None => top.ttl.unwrap_or(Some(crate::DEFAULT_TTL)),
    };
    let wait = match table.and_then(|t| t.wait.as_ref()) {
        Some(p) => wait(p)
            .map_err(|why| problems.push(format!("{at}.wait: {why}")))
            .unwrap_or_default(),
        None => top.wait.unwrap_or_default(),
    };
    let prefix = table
        .and_then(|t| t.prefix.clone())
        .or_else(|| top.prefix.map(str::to_owned))
        .unwrap_or_default();
    CheckedEntry {
        store: StoreSpec::members(expanded, quorum.unwrap_or_default()),
        prefix,
        ttl,
        wait,
    }
}

/// An entry's DSNs as written, and how they decide when they are a quorum.
fn entry_stores<'e>(
    at: &str,
    entry: &'e Entry,
    problems: &mut Vec<String>,
) -> (Vec<String>, Option<QuorumKind>, Option<&'e EntryTable>) {
    let (dsns, quorum, table) = match entry {
        Entry::Dsn(dsn) => (vec![dsn.clone()], None, None),
        Entry::Quorum(dsns) => (dsns.clone(), Some(QuorumKind::Consensus), None),
        Entry::Table(t) => {
            let dsns = match (&t.dsn, &t.dsns) {
                (Some(dsn), None) => vec![dsn.clone()],
                (None, Some(dsns)) => dsns.clone(),
                (Some(_), Some(_)) => {
                    problems.push(format!("{at}: give dsn or dsns, not both"));
                    vec![]
                }
                (None, None) => {
                    problems.push(format!(
                        "{at}: no store: give dsn = \"...\" or dsns = [\"...\", ...]"
                    ));
                    vec![]
                }
            };
            (dsns, strategy(at, t, problems), Some(t))
        }
    };
    if quorum.is_some() && dsns.len() < 2 && !dsns.is_empty() {
        problems.push(format!(
            "{at}: a quorum needs at least two stores; write one store's DSN alone"
        ));
    }
    if matches!(entry, Entry::Quorum(d) if d.is_empty())
        || table.is_some_and(|t| t.dsns.as_ref().is_some_and(Vec::is_empty))
    {
        problems.push(format!("{at}: the list of stores is empty"));
    }
    (dsns, quorum, table)
}

/// A table entry's quorum rule (`None`: one store).
fn strategy(at: &str, t: &EntryTable, problems: &mut Vec<String>) -> Option<QuorumKind> {
    match (t.dsns.is_some(), t.strategy.as_deref()) {
        (false, None) => None,
        (false, Some(_)) => {
            problems.push(format!(
                "{at}: a strategy applies to a quorum (dsns = [...]), not to one store"
            ));
            None
        }
        (true, None | Some("consensus")) => Some(QuorumKind::Consensus),
        (true, Some("unanimous")) => Some(QuorumKind::Unanimous),
        (true, Some(other)) => {
            problems.push(format!(
                "{at}: unknown strategy {other:?}: write consensus (a strict majority) or \
                 unanimous"
            ));
            None
        }
    }
}

/// Each DSN with its variables expanded and accepted by a store of this build.
fn expand_all(
    at: &str,
    dsns: &[String],
    quorum: bool,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<String>,
) -> Vec<String> {
    let mut expanded = Vec::with_capacity(dsns.len());
    for (i, dsn) in dsns.iter().enumerate() {
        let here = if dsns.len() > 1 || quorum {
            format!("{at}[{i}]")
        } else {
            at.to_owned()
        };
        match expand(dsn, env) {
            Ok(dsn) => match refusal(&dsn, StoreFactory::kind(&dsn)) {
                None => expanded.push(dsn),
                Some(why) => problems.push(format!("{here}: {why}")),
            },
            Err(problem) => problems.extend(expansion_problems(&here, problem)),
        }
    }
    expanded
}

/// Why `dsn` (of a store of `kind`) cannot be an entry's store, or `None`.
///
/// A store this build lacks is no problem here: one configuration file is shared by
/// applications built with different features, each using some of its entries. Such an entry
/// is checked no further (its store's grammar is not in the build) and fails when it is used
/// ([`Locks::factory`](super::Locks::factory): unsupported, naming the feature);
/// [`CheckedEntry::missing_features`] tells beforehand.
fn refusal(dsn: &str, kind: Option<StoreKind>) -> Option<String> {
    if kind.is_some_and(|k| !k.built) {
        return None;
    }
    StoreFactory::validate(dsn)
        .err()
        .map(|e| e.reason().unwrap_or("invalid").to_owned())
}

impl CheckedEntry {
    /// The cargo features this entry's stores need that this build lacks (empty: it can be
    /// used). [`LocksConfig::check`] accepts such an entry, so that a configuration shared with
    /// applications built otherwise loads; using it fails.
    pub fn missing_features(&self) -> Vec<&'static str> {
        let mut missing: Vec<&'static str> = self
            .store
            .dsns()
            .iter()
            .filter_map(|dsn| StoreFactory::kind(dsn))
            .filter(|kind| !kind.built)
            .map(|kind| kind.feature)
            .collect();
        missing.dedup();
        missing
    }
}

/// What opens a variable: written through this, the message below keeps its braces balanced
/// (source tools that count braces read the function's end where it is).
const OPEN: &str = "${";

/// What a DSN's `${VAR}`s got wrong, one line each, naming the entry at `here`.
fn expansion_problems(here: &str, problem: Problem) -> Vec<String> {
    match problem {
        Problem::Unset(names) => names
            .into_iter()
            .map(|name| format!("{here}: ${{{name}}} is not set"))
            .collect(),
        Problem::Unclosed => vec![format!("{here}: a ${{ without its closing }}")],
        Problem::BadName(name) => vec![format!(
            "{here}: ${{{name}}} is not a variable name (letters, digits and _; write ${OPEN} for \
             a literal {OPEN})"
        )],
    }
}

/// A period: seconds or humantime text, at most [`MAX_DURATION`](crate::MAX_DURATION).
fn period(p: &Period) -> Result<Duration, String> {
    let too_long = || "too long: the longest accepted is 3650 days".to_owned();
    let d = match p {
        Period::Seconds(s) => {
            if !s.is_finite() || *s < 0.0 {
                return Err(format!("{s} is not a period: seconds must be at least 0"));
            }
            Duration::try_from_secs_f64(*s).map_err(|_| too_long())?
        }
        Period::Text(t) => match t.trim().parse::<f64>() {
            Ok(s) => return period(&Period::Seconds(s)),
            Err(_) => humantime::parse_duration(t.trim()).map_err(|e| {
                format!(
                    "{t:?} is not a period ({e}); write seconds (30, 0.5) or a period like \
                     \"30s\", \"5 minutes\" or \"1h30m\""
                )
            })?,
        },
    };
    if d > crate::MAX_DURATION {
        return Err(too_long());
    }
    Ok(d)
}

fn ttl(p: &Period) -> Result<Option<Duration>, String> {
    match p {
        Period::Text(t) if t.trim() == "none" => Ok(None),
        p => period(p).map(|d| Some(d).filter(|d| !d.is_zero())),
    }
}

fn wait(p: &Period) -> Result<Wait, String> {
    match p {
        Period::Text(t) if t.trim() == "forever" => Ok(Wait::Forever),
        p => period(p).map(|d| {
            if d.is_zero() {
                Wait::Never
            } else {
                Wait::AtMost(d)
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store_factory::Fencing;

    fn sql_kind(built: bool) -> StoreKind {
        StoreKind {
            name: "sql",
            schemes: &["postgres"],
            keywords: &[],
            example: "postgres://app@db/app",
            summary: "the SQL table store",
            feature: "sql",
            built,
            fencing: Fencing::PerResource,
            tables: true,
            counting: true,
            lists: true,
            secret_options: &[],
        }
    }

    /// The decision a build without `sql` takes (this test runs in every build): an entry of a
    /// store the build lacks is kept, whatever its DSN says; one the build has is checked.
    #[test]
    fn a_store_this_build_lacks_is_no_problem_until_used() {
        let dsn = "postgres://app@db/app?no_such_option=1";
        assert_eq!(refusal(dsn, Some(sql_kind(false))), None);
        if StoreFactory::kind(dsn).is_some_and(|k| k.built) {
            let why = refusal(dsn, Some(sql_kind(true))).expect("refused");
            assert!(why.contains("no_such_option"), "{why}");
        }
        let why = refusal("redsi://h", None).expect("no store");
        assert!(why.contains("did you mean"), "{why}");
    }

    /// A file shared by applications built with other features loads in every build; what this
    /// build cannot use is named by its entry.
    #[test]
    fn a_shared_file_loads_in_every_build() {
        let config = LocksConfig::from_toml_str(
            "[stores]\ndefault = \"in-memory\"\ndb = \"postgres://app@db/app\"\n\
             quorum = [\"etcd://e1:2379\", \"etcd://e2:2379\", \"in-memory\"]\n",
        )
        .unwrap();
        let checked = config.check_with(&|_| None).expect("loads");
        let missing = |entry: &str| checked.entries[entry].missing_features();
        assert!(missing("default").is_empty());
        let built = |dsn: &str| StoreFactory::kind(dsn).is_some_and(|k| k.built);
        assert_eq!(missing("db").is_empty(), built("postgres://h/db"));
        assert_eq!(missing("quorum").is_empty(), built("etcd://h:2379"));
        if !built("etcd://h:2379") {
            assert_eq!(missing("quorum"), ["etcd"], "each feature once");
        }
    }
}
