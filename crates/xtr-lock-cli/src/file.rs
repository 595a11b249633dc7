//! The lock configuration file (`--config`, `$XTR_LOCK_CONFIG`): read, checked with every
//! problem at once, and one entry of it turned into the store, prefix, ttl and wait of a command.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use xtr_lock::config::{CheckedConfig, CheckedEntry, DEFAULT_ENTRY, Entry, LocksConfig};

/// The environment variable a configuration file is read from when `--config` is absent.
pub(crate) const CONFIG_ENV: &str = "XTR_LOCK_CONFIG";

/// The environment variable naming the entry of `$XTR_LOCK_CONFIG`'s file when `--use` is
/// absent: what `run` sets for a nested `xtr-lock` when it was given `--config`/`--use`.
pub(crate) const USE_ENV: &str = "XTR_LOCK_USE";

/// A configuration file read and checked.
pub(crate) struct Loaded {
    pub path: PathBuf,
    /// As written: where each entry's settings come from ([`origins`]).
    pub raw: LocksConfig,
    pub checked: CheckedConfig,
}

/// Where a setting a command uses came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Nobody set it: the default, the same in the library, the CLI and files (a ttl of
    /// [`xtr_lock::DEFAULT_TTL`], waiting forever, no prefix).
    Default,
    /// The file's top level.
    File,
    /// The entry's own table.
    Entry,
    /// The command line.
    Flag,
}

impl Origin {
    /// Whether somebody asked for the value (the command line or the file).
    pub(crate) fn explicit(self) -> bool {
        self != Origin::Default
    }

    /// How `config show` names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Origin::Default => "default",
            Origin::File => "file",
            Origin::Entry => "entry",
            Origin::Flag => "flag",
        }
    }
}

/// Where an entry's prefix, ttl and wait come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origins {
    pub prefix: Origin,
    pub ttl: Origin,
    pub wait: Origin,
}

/// Where the settings of `entry` in `raw` come from: its own table, else the file's top level,
/// else the defaults (which [`LocksConfig::check`] filled in).
pub(crate) fn origins(raw: &LocksConfig, entry: &str) -> Origins {
    let table = match raw.stores.get(entry) {
        Some(Entry::Table(t)) => Some(t),
        _ => None,
    };
    let origin = |in_entry: bool, at_top: bool| match (in_entry, at_top) {
        (true, _) => Origin::Entry,
        (false, true) => Origin::File,
        (false, false) => Origin::Default,
    };
    Origins {
        prefix: origin(
            table.is_some_and(|t| t.prefix.is_some()),
            raw.prefix.is_some(),
        ),
        ttl: origin(table.is_some_and(|t| t.ttl.is_some()), raw.ttl.is_some()),
        wait: origin(table.is_some_and(|t| t.wait.is_some()), raw.wait.is_some()),
    }
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
        raw,
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
    /// Its store, prefix, ttl and wait, the defaults filled in.
    pub checked: CheckedEntry,
    /// Whether the file set them, or the defaults did.
    pub origins: Origins,
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
        Ok(Configured {
            path: path.to_owned(),
            explicit,
            origins: origins(&raw, &entry),
            entry,
            checked,
        })
    }
}
