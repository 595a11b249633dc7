//! The store a [`Source`] names, opened (nothing connects yet): one store, or a quorum of them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use xtr_lock::store::{CombinedStore, ConsensusStrategy, UnanimousStrategy};
use xtr_lock::{Lock, LockFactory, Store, StoreFactory};

use crate::args::Source;

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
            if c.checked.store.quorum() == Some(xtr_lock::config::QuorumKind::Unanimous));
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
