//! The store a [`Source`] names, opened (nothing connects yet): one store, or a quorum of them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use xtr_lock::store::Capabilities;
use xtr_lock::{Fencing, Lock, LockFactory, Mode, QuorumKind, Store, StoreFactory, StoreSpec};

use crate::args::{Source, Take};
use crate::file::Origin;

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
    /// How the store counts fencing tokens (`None` for a quorum, which has none of its own).
    pub fencing: Option<Fencing>,
    /// Each store (each member of a quorum) by its short name, with what it does: whether it
    /// does what the command line asked ([`StoreConfig::check_take`]).
    members: Vec<(&'static str, Capabilities)>,
}

impl StoreConfig {
    /// Opens the store `source` names (nothing connects yet). Unless `quiet`, warns about
    /// stores that lock nothing between processes.
    pub(crate) fn open(source: &Source, quiet: bool) -> Result<StoreConfig> {
        let spec = source.spec();
        let config = StoreConfig::from_spec(&spec).with_context(|| match source {
            Source::Flag(d) | Source::Env(d) if d.len() > 1 => {
                format!("{} lists a DSN that names no usable store", source.name())
            }
            _ => format!("{} names no usable store", source.name()),
        })?;
        if !quiet {
            warn_about(&spec);
        }
        Ok(config)
    }

    /// The stores a handed-over key names, one or a quorum by consensus.
    pub(crate) fn from_dsns(dsns: &[String]) -> Result<StoreConfig> {
        StoreConfig::from_spec(&StoreSpec::members(dsns.to_vec(), QuorumKind::Consensus))
    }

    fn from_spec(spec: &StoreSpec) -> Result<StoreConfig> {
        let members = spec.build_members()?;
        let locators: Option<Vec<String>> = spec
            .dsns()
            .iter()
            .zip(&members)
            .map(|(dsn, store)| locator(dsn, &**store))
            .collect();
        let in_memory = spec.dsns().iter().any(|d| kind_name(d) == Some("memory"));
        let kinds = spec
            .dsns()
            .iter()
            .zip(&members)
            .map(|(dsn, store)| (kind_name(dsn).unwrap_or("?"), store.capabilities()))
            .collect();
        let store = spec.assemble(members)?;
        // In-memory locks die with this process; flock keys hold an open file.
        let keys_travel = store.capabilities().serializable_keys && !in_memory;
        Ok(StoreConfig {
            store,
            scheme: spec.kind_name(),
            keys_travel,
            locators: locators.filter(|_| keys_travel),
            fencing: match spec.dsns() {
                [one] if spec.quorum().is_none() => StoreFactory::kind(one).map(|k| k.fencing),
                _ => None,
            },
            members: kinds,
        })
    }

    pub(crate) fn factory(&self) -> LockFactory {
        LockFactory::from_arc(self.store.clone())
    }

    /// A lock on `resource` (a new holder) with `ttl` (`None`: no expiry).
    pub(crate) fn lock(&self, resource: &str, ttl: Option<Duration>) -> Lock {
        self.factory().create_lock(resource).with_ttl(ttl)
    }

    /// Checks that the store can take the lock as the command line (or the configuration
    /// file) asked: no ttl (`none`) is refused on a store whose locks expire, before anything
    /// is stored. Then warns, unless `-q`, once per kind of store, where the lock taken is not
    /// what was asked for: `-s` on a store without shared locks takes the exclusive lock; a
    /// ttl on a store whose locks end with their holder is not used (a ttl nobody asked for,
    /// the default, is not worth a word).
    pub(crate) fn check_take(&self, take: &Take) -> Result<()> {
        let asked = match take.ttl_from {
            Origin::Flag => "--ttl",
            _ => "the configuration file's ttl",
        };
        let expiring = self.members.iter().find(|(_, caps)| caps.expiring);
        if let (None, Some((name, _))) = (take.ttl, expiring) {
            anyhow::bail!(
                "{asked} is none, and the {name} store's locks expire: give it a duration"
            );
        }
        if take.quiet {
            return Ok(());
        }
        let mut seen: Vec<&str> = Vec::new();
        for (name, caps) in &self.members {
            if seen.contains(name) {
                continue;
            }
            seen.push(name);
            if take.mode == Mode::Read && !caps.shared {
                crate::output::warning(&format!(
                    "the {name} store has no shared locks; -s takes an exclusive lock"
                ));
            }
            if take.ttl.is_some() && take.ttl_from.explicit() && ends_with_holder(caps) {
                crate::output::warning(&format!(
                    "the {name} store's locks do not expire: {asked} is not used, the lock ends \
                     with its holder"
                ));
            }
        }
        Ok(())
    }
}

/// Whether a lock on a store with `caps` lasts exactly as long as its holder, so that a ttl is
/// not used: it does not expire, and a dead holder frees it at once (not the etcd store, whose
/// lease has the lock's ttl, nor the null store, which locks nothing).
fn ends_with_holder(caps: &Capabilities) -> bool {
    caps.excludes && !caps.expiring && caps.liveness
}

/// A credential-free DSN that reaches the locks `store` keeps (built from `dsn`), or `None` if
/// they cannot be reached from another process.
fn locator(dsn: &str, store: &dyn Store) -> Option<String> {
    if kind_name(dsn) == Some("null") {
        return Some("null".to_owned());
    }
    let shown = store.locks_in()?;
    // Only what the factory can open again: Redis's form is a DSN; flock's and memory's are not.
    StoreFactory::validate(&shown).ok().map(|()| shown)
}

/// The short name of the store `dsn` names (`memory`, `null`, `redis`).
fn kind_name(dsn: &str) -> Option<&'static str> {
    StoreFactory::kind(dsn).map(|k| k.name)
}

/// Warns, once per DSN, about stores that lock nothing between processes.
fn warn_about(spec: &StoreSpec) {
    let mut seen: Vec<&str> = Vec::new();
    for dsn in spec.dsns() {
        if seen.contains(&dsn.as_str()) {
            continue;
        }
        seen.push(dsn);
        let warning = match kind_name(dsn) {
            Some("memory") => {
                "in-memory locks live in this process only: nothing is locked between \
                 processes (use flock or redis://)"
            }
            Some("null") => "the null store locks nothing: every lock is granted",
            _ => continue,
        };
        crate::output::warning(warning);
    }
}
