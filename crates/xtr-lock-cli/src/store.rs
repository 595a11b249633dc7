//! The store a [`Source`] names, opened (nothing connects yet): one store, or a quorum of them.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use xtr_lock::store::Capabilities;
use xtr_lock::{Fencing, Key, Lock, LockFactory, Mode, QuorumKind, Store, StoreFactory, StoreSpec};

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
    /// Where each member keeps its locks, as DSNs without a password that reach them again as
    /// the same user (`redis://h:6379/0?prefix=app%3A`, `postgres://app@db:5432/app`): what a
    /// handed-over key names. `None` when a member's locks cannot be reached from another
    /// process (flock, in-memory).
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

    /// A lock on `resource` (a new holder) with the take's ttl (`None`: no expiry), or, with
    /// `--limit`, a holder of the semaphore's permits (a lock whose key carries them).
    pub(crate) fn lock(&self, resource: &str, take: &Take) -> Lock {
        let lock = match take.permits {
            Some(permits) => self
                .factory()
                .create_lock_from_key(Key::for_semaphore(resource, permits))
                .with_ttl(take.ttl),
            None => self.factory().create_lock(resource).with_ttl(take.ttl),
        };
        // Checked against the cap when it was made (`crate::meta`): nothing to refuse here.
        if let Err(err) = lock.key().set_meta(take.meta.clone()) {
            crate::output::warning(&crate::output::causes(&err));
        }
        lock
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
            if take.meta_given && !caps.metadata {
                crate::output::warning(&format!(
                    "the {name} store keeps no holder metadata: --meta is not kept"
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

/// A DSN without a password that reaches the locks `store` keeps (built from `dsn`), as the
/// user `dsn` names, or `None` if they cannot be reached from another process.
fn locator(dsn: &str, store: &dyn Store) -> Option<String> {
    if kind_name(dsn) == Some("null") {
        return Some("null".to_owned());
    }
    let shown = store.locks_in()?;
    // Only what the factory can open again: Redis's form is a DSN; flock's and memory's are not.
    StoreFactory::validate(&shown).ok()?;
    let as_user = with_user(dsn, &shown);
    Some(match StoreFactory::validate(&as_user) {
        Ok(()) => as_user,
        Err(_) => shown,
    })
}

/// `shown` (a DSN without credentials) with the user name `dsn` logs in as, which a key must
/// keep to reach its store as the same user (a PostgreSQL role, a Redis ACL user):
/// `postgres://app@db:5432/app`. Never the password: a key travels through pipes, files and
/// logs. On Redis a user name alone (`redis://word@host`) is left out: it logs in as nobody (no
/// AUTH is sent without a password), and it is often a password written in the wrong place.
fn with_user(dsn: &str, shown: &str) -> String {
    let Some((user, has_password)) = user_of(dsn) else {
        return shown.to_owned();
    };
    if !has_password && matches!(kind_name(dsn), Some("redis" | "pubsub")) {
        return shown.to_owned();
    }
    match shown.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{user}@{rest}"),
        None => shown.to_owned(),
    }
}

/// The user name of `scheme://user[:password]@host…` as written (percent-encoded), and whether a
/// password follows it.
fn user_of(dsn: &str) -> Option<(&str, bool)> {
    let userinfo = userinfo(dsn)?;
    let (user, has_password) = match userinfo.split_once(':') {
        Some((user, _)) => (user, true),
        None => (userinfo, false),
    };
    (!user.is_empty()).then_some((user, has_password))
}

/// What comes before the `@` of a DSN's authority, if it has one.
fn userinfo(dsn: &str) -> Option<&str> {
    let (_, rest) = dsn.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    authority.rsplit_once('@').map(|(userinfo, _)| userinfo)
}

/// `dsn` without its user name (a locator never has a password): where the locks are, whoever
/// takes them.
pub(crate) fn without_user(dsn: &str) -> String {
    match (dsn.split_once("://"), userinfo(dsn)) {
        (Some((scheme, rest)), Some(userinfo)) => {
            let rest = rest
                .strip_prefix(userinfo)
                .and_then(|r| r.strip_prefix('@'));
            rest.map_or_else(|| dsn.to_owned(), |rest| format!("{scheme}://{rest}"))
        }
        _ => dsn.to_owned(),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locator_keeps_the_user_name_and_never_the_password() {
        for (dsn, shown, locator) in [
            (
                "postgres://app:pw@db/app",
                "postgres://db:5432/app",
                "postgres://app@db:5432/app",
            ),
            (
                "postgres://app@db/app",
                "postgres://db:5432/app",
                "postgres://app@db:5432/app",
            ),
            (
                "postgres://db/app",
                "postgres://db:5432/app",
                "postgres://db:5432/app",
            ),
            (
                "redis://alice:p%40ss@h/0",
                "redis://h:6379/0",
                "redis://alice@h:6379/0",
            ),
            ("redis://:pw@h/0", "redis://h:6379/0", "redis://h:6379/0"),
            // A lone word before `@` on Redis logs in as nobody, and may be a password.
            (
                "redis://maybe-a-password@h/0",
                "redis://h:6379/0",
                "redis://h:6379/0",
            ),
            (
                "unix://u:p@/run/redis.sock",
                "unix:///run/redis.sock?db=0",
                "unix://u@/run/redis.sock?db=0",
            ),
            // An `@` in a password that was not percent-encoded: the user is what precedes `:`.
            (
                "mysql://u:p@ss@h/db",
                "mysql://h:3306/db",
                "mysql://u@h:3306/db",
            ),
        ] {
            let made = with_user(dsn, shown);
            assert_eq!(made, locator, "{dsn}");
            assert_eq!(without_user(&made), shown, "{dsn}");
        }
    }
}
