//! Named stores from configuration: [`LocksConfig`], what an application's config file says
//! about its locks, deserialized with serde (embed it in your own config struct, whatever
//! loader you use) or read from a TOML file, and checked at start-up with every problem
//! reported at once ([`LocksConfig::check`]). See docs/config.md for the design.
//!
//! ```toml
//! prefix = "billing:"        # in front of every resource
//! ttl = "5 minutes"          # humantime or seconds; "none" for no ttl
//! wait = "30s"               # "forever" (the default) or "0" (try once)
//! default = "redis"          # the entry used when none is named ("default" if not given)
//!
//! [stores]
//! redis = "redis://:${REDIS_PASSWORD}@cache:6379/0"
//! quorum = ["redis://r1", "redis://r2", "redis://r3"]
//! db = { dsn = "postgresql+advisory://app:${PGPASSWORD}@db/app", ttl = "none" }
//! ```
//!
//! Without any configuration ([`LocksConfig::default`]) there is one entry, `default = "flock"`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod check;
mod expand;
mod locks;

pub use crate::store_factory::{QuorumKind, StoreSpec};
pub use check::{CheckedConfig, CheckedEntry, ConfigErrors};
pub use locks::{Locks, PING_RESOURCE};

/// The name of the entry used when the configuration names none.
pub const DEFAULT_ENTRY: &str = "default";

/// What a configuration says about locks: named store entries and the defaults their locks get.
///
/// Deserializing never fails on a value it could check later (a malformed period, a DSN, an
/// unset variable): those are all reported together by [`check`](LocksConfig::check).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocksConfig {
    /// Put in front of every resource of every entry (an entry may set its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// The ttl locks get: a humantime period (`"5 minutes"`), seconds, or `"none"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Period>,
    /// How long `run` and `lock` wait: a period, seconds, `"forever"` or `0` (try once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Period>,
    /// The entry used when none is named; `"default"` when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// The named entries. Empty: one entry `default = "flock"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stores: BTreeMap<String, Entry>,
}

/// A period as written: seconds or text (checked later).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Period {
    /// Seconds (`30`, `0.5`).
    Seconds(f64),
    /// A humantime period (`"30s"`, `"5 minutes"`, `"1h30m"`) or a keyword (`"none"`,
    /// `"forever"`).
    Text(String),
}

/// One named entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Entry {
    /// One store's DSN.
    Dsn(String),
    /// A quorum (strict majority) over these stores' DSNs.
    Quorum(Vec<String>),
    /// The long form, with settings of its own.
    Table(EntryTable),
}

/// An entry's long form: `dsn` or `dsns` (a quorum), and what overrides the top level.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryTable {
    /// One store's DSN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsn: Option<String>,
    /// A quorum over these stores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsns: Option<Vec<String>>,
    /// The quorum's rule: `"consensus"` (a strict majority, the default) or `"unanimous"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// This entry's prefix, instead of the top level's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// This entry's ttl, instead of the top level's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Period>,
    /// This entry's wait, instead of the top level's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Period>,
}

impl LocksConfig {
    /// Reads a configuration from TOML text.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for text that is not
    /// TOML or not this shape, naming the line and the field (never a value).
    pub fn from_toml_str(text: &str) -> Result<Self> {
        parse_toml(text).map_err(|why| {
            Error::invalid_argument(format!("the lock configuration is not valid: {why}"))
        })
    }

    /// Reads a configuration from a TOML file.
    ///
    /// # Errors
    ///
    /// As [`from_toml_str`](Self::from_toml_str), naming the file, and an error naming the file
    /// when it cannot be read.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid_argument(format!(
                "cannot read the lock configuration {}: {e}",
                path.display()
            ))
        })?;
        parse_toml(&text).map_err(|why| {
            Error::invalid_argument(format!(
                "the lock configuration {} is not valid: {why}",
                path.display()
            ))
        })
    }
}

/// toml's message without its excerpt of the text (which could hold a credential), with the
/// line it is about.
fn parse_toml(text: &str) -> std::result::Result<LocksConfig, String> {
    toml::from_str(text).map_err(|e: toml::de::Error| {
        let at = e
            .span()
            .map(|s| format!("line {}: ", 1 + text[..s.start].matches('\n').count()))
            .unwrap_or_default();
        format!("{at}{}", e.message().trim_end())
    })
}
