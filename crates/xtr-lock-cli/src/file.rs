//! The lock configuration file (`--config`, `$XTR_LOCK_CONFIG`): read, checked with every
//! problem at once, and one entry of it turned into the store, prefix, ttl and wait of a command.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, anyhow};
use xtr_lock::Wait;
use xtr_lock::config::{CheckedConfig, CheckedEntry, DEFAULT_ENTRY, Entry, LocksConfig};

/// The environment variable a configuration file is read from when `--config` is absent.
pub(crate) const CONFIG_ENV: &str = "XTR_LOCK_CONFIG";

/// The environment variable naming the entry of `$XTR_LOCK_CONFIG`'s file when `--use` is
/// absent: what `run` sets for a nested `xtr-lock` when it was given `--config`/`--use`.
pub(crate) const USE_ENV: &str = "XTR_LOCK_USE";

/// A configuration file read and checked.
pub(crate) struct Loaded {
    pub path: PathBuf,
    pub checked: CheckedConfig,
}

/// Why a file could not be used: it cannot be read or parsed (one line), or it has problems
/// (one line each).
pub(crate) enum LoadError {
    Unreadable(String),
    Problems(Vec<String>),
}

impl LoadError {
    /// One message for commands other than `config check`: every problem on its own line.
    pub(crate) fn into_anyhow(self, path: &Path) -> anyhow::Error {
        match self {
            LoadError::Unreadable(why) => anyhow!("{why}"),
            LoadError::Problems(problems) => anyhow!(
                "the lock configuration {} has {} problem{}:\n  {}",
                path.display(),
                problems.len(),
                if problems.len() == 1 { "" } else { "s" },
                problems.join("\n  ")
            ),
        }
    }
}

/// Reads the configuration file at `path` (not yet checked); the error is one line.
fn read(path: &Path) -> std::result::Result<LocksConfig, String> {
    LocksConfig::from_toml_file(path)
        .map_err(|e| e.reason().map_or_else(|| e.to_string(), str::to_owned))
}

/// Reads and checks the configuration file at `path`.
pub(crate) fn load(path: &Path) -> std::result::Result<Loaded, LoadError> {
    let raw = read(path).map_err(LoadError::Unreadable)?;
    let checked = raw.check().map_err(|e| LoadError::Problems(e.problems))?;
    Ok(Loaded {
        path: path.to_owned(),
        checked,
    })
}

/// The file named by `flag`, else by `$XTR_LOCK_CONFIG`.
pub(crate) fn path(flag: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = flag {
        return Some(path.to_owned());
    }
    std::env::var_os(CONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The entry `$XTR_LOCK_USE` names, if it is set.
pub(crate) fn entry_from_env() -> Result<Option<String>> {
    match std::env::var(USE_ENV) {
        Ok(name) if !name.trim().is_empty() => Ok(Some(name)),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(anyhow!("${USE_ENV} is not valid UTF-8")),
    }
}

/// One entry of a configuration file, as a command uses it.
#[derive(Debug, Clone)]
pub(crate) struct Configured {
    pub path: PathBuf,
    /// Named on the command line (`--config` or `--use`), not only by the environment.
    pub explicit: bool,
    pub entry: String,
    pub checked: CheckedEntry,
    /// The file's ttl for this entry, when it sets one as a period.
    pub ttl: Option<Duration>,
    /// The file's wait for this entry, when it sets one.
    pub wait: Option<Wait>,
}

impl Configured {
    /// The entry `name` (or the file's default) of the file at `path`. Only that entry (and
    /// the file's top level) is checked: a command is not refused for another entry's unset
    /// variable; `config check` checks them all.
    pub(crate) fn open(path: &Path, explicit: bool, name: Option<&str>) -> Result<Configured> {
        let mut raw = read(path).map_err(|why| anyhow!("{why}"))?;
        let entry = name
            .or(raw.default.as_deref())
            .unwrap_or(DEFAULT_ENTRY)
            .to_owned();
        if !raw.stores.is_empty() && !raw.stores.contains_key(&entry) {
            return Err(anyhow!(
                "the lock configuration {} has no entry {entry:?} (its entries: {})",
                path.display(),
                raw.stores
                    .keys()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        raw.stores.retain(|name, _| *name == entry);
        raw.default = Some(entry.clone());
        let all = raw
            .check()
            .map_err(|e| LoadError::Problems(e.problems).into_anyhow(path))?;
        let checked = all.entries.get(&entry).cloned().ok_or_else(|| {
            anyhow!(
                "the lock configuration {} has no entry {entry:?}",
                path.display()
            )
        })?;
        // What the file itself says, the entry's table first: an unset ttl or wait leaves the
        // command's own default (60s, forever), not the library's.
        let table = match raw.stores.get(&entry) {
            Some(Entry::Table(t)) => Some(t),
            _ => None,
        };
        let ttl_set = table.and_then(|t| t.ttl.as_ref()).or(raw.ttl.as_ref());
        let wait_set = table.and_then(|t| t.wait.as_ref()).or(raw.wait.as_ref());
        Ok(Configured {
            path: path.to_owned(),
            explicit,
            ttl: ttl_set.and(checked.ttl),
            wait: wait_set.map(|_| checked.wait),
            entry,
            checked,
        })
    }
}
