//! [`StoreSpec`]: one store or a quorum, from a DSN, a comma-separated list or a configuration
//! entry, built by one function (the factory, configurations and the CLI all go through it).

use std::sync::Arc;

use super::StoreFactory;
use crate::error::Result;
use crate::store::{CombinedStore, ConsensusStrategy, Store, UnanimousStrategy};

/// How a quorum decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuorumKind {
    /// A strict majority of the members (the default).
    #[default]
    Consensus,
    /// Every member.
    Unanimous,
}

/// Where locks live: one store's DSN, or a quorum of several with how it decides. Its `Debug`
/// shows schemes only.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreSpec {
    dsns: Vec<String>,
    quorum: Option<QuorumKind>,
}

impl std::fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSpec")
            .field("stores", &self.schemes())
            .field("quorum", &self.quorum)
            .finish()
    }
}

impl StoreSpec {
    /// One store.
    pub fn one(dsn: impl Into<String>) -> Self {
        StoreSpec {
            dsns: vec![dsn.into()],
            quorum: None,
        }
    }

    /// One store if `dsns` holds one DSN, a quorum deciding by `kind` if it holds several.
    pub fn members(dsns: Vec<String>, kind: QuorumKind) -> Self {
        let quorum = (dsns.len() > 1).then_some(kind);
        StoreSpec { dsns, quorum }
    }

    /// A comma-separated list (`redis://a,redis://b,redis://c`: a quorum by consensus). A comma
    /// starts a new DSN only where what follows looks like one (`scheme://`, `sqlite:`, or a
    /// keyword such as `flock`), so a DSN whose own text holds commas (etcd's members, an option
    /// value) stays whole.
    pub fn parse_list(text: &str) -> Self {
        Self::members(split_list(text), QuorumKind::Consensus)
    }

    /// The DSNs, one or the quorum's members.
    pub fn dsns(&self) -> &[String] {
        &self.dsns
    }

    /// How the quorum decides; `None` for one store.
    pub fn quorum(&self) -> Option<QuorumKind> {
        self.quorum
    }

    /// The members' schemes (or keywords), lower-cased: all of a DSN that is ever shown.
    pub fn schemes(&self) -> Vec<String> {
        self.dsns.iter().map(|d| scheme_of(d)).collect()
    }

    /// What the store is called in messages: `redis`, or `combined(redis,redis,redis)`.
    pub fn kind_name(&self) -> String {
        match self.quorum {
            None => self.schemes().join(","),
            Some(_) => format!("combined({})", self.schemes().join(",")),
        }
    }

    /// Builds the store (a [`CombinedStore`] for a quorum). Never touches the network.
    ///
    /// # Errors
    ///
    /// The first member that names no store (showing its scheme only); an empty spec.
    pub fn build(&self) -> Result<Arc<dyn Store>> {
        self.assemble(self.build_members()?)
    }

    /// Builds each member's store, in order (the one store's, for one).
    ///
    /// # Errors
    ///
    /// The first member that names no store, showing its scheme only.
    pub fn build_members(&self) -> Result<Vec<Arc<dyn Store>>> {
        self.dsns
            .iter()
            .map(|d| StoreFactory::create_store(d))
            .collect()
    }

    /// The store over `members` (from [`build_members`](Self::build_members)): the one store,
    /// or the quorum deciding as this spec says.
    ///
    /// # Errors
    ///
    /// No member; members that [`CombinedStore::new`] refuses (one place twice).
    pub fn assemble(&self, members: Vec<Arc<dyn Store>>) -> Result<Arc<dyn Store>> {
        if let (None, [one]) = (self.quorum, members.as_slice()) {
            return Ok(one.clone());
        }
        Ok(Arc::new(match self.quorum {
            Some(QuorumKind::Unanimous) => CombinedStore::new(members, UnanimousStrategy)?,
            _ => CombinedStore::new(members, ConsensusStrategy)?,
        }))
    }
}

/// A DSN's scheme (or keyword), lower-cased.
fn scheme_of(dsn: &str) -> String {
    let scheme = dsn.split_once(':').map_or(dsn, |(s, _)| s);
    crate::redact::shown_scheme(scheme).to_ascii_lowercase()
}

fn split_list(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for piece in text.split(',') {
        let trimmed = piece.trim();
        match out.last_mut() {
            Some(last) if !last.is_empty() && !starts_dsn(trimmed) => {
                last.push(',');
                last.push_str(piece);
            }
            _ => out.push(trimmed.to_owned()),
        }
    }
    out.into_iter()
        .map(|d| d.trim().to_owned())
        .filter(|d| !d.is_empty())
        .collect()
}

/// Whether `piece` starts a DSN: a keyword of the scheme table, `scheme://`, or `sqlite:`.
fn starts_dsn(piece: &str) -> bool {
    if super::schemes::table()
        .iter()
        .any(|r| r.kind.keywords.contains(&piece))
    {
        return true;
    }
    match piece.split_once(':') {
        Some((scheme, rest)) => {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && (rest.starts_with("//") || scheme.eq_ignore_ascii_case("sqlite"))
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_split_where_a_dsn_starts() {
        let list = |t: &str| StoreSpec::parse_list(t).dsns().to_vec();
        assert_eq!(
            list("redis://a:1/0, redis://b:2/0,flock"),
            ["redis://a:1/0", "redis://b:2/0", "flock"]
        );
        assert_eq!(
            list("etcd://h1:2379,h2:2379,redis://c"),
            ["etcd://h1:2379,h2:2379", "redis://c"]
        );
        assert_eq!(list("redis://h?prefix=a,b"), ["redis://h?prefix=a,b"]);
        assert_eq!(list("flock:///d"), ["flock:///d"]);
        assert_eq!(list(" , "), Vec::<String>::new());
        assert_eq!(StoreSpec::parse_list("flock").quorum(), None);
        let q = StoreSpec::parse_list("in-memory,in-memory,in-memory");
        assert_eq!(q.quorum(), Some(QuorumKind::Consensus));
        assert_eq!(q.kind_name(), "combined(in-memory,in-memory,in-memory)");
        assert!(q.build().is_ok());
        assert!(
            StoreSpec::members(vec![], QuorumKind::Consensus)
                .build()
                .is_err()
        );
        assert!(!format!("{:?}", StoreSpec::one("redis://:pw@h")).contains("pw"));
        assert!(!format!("{:?}", StoreSpec::one("pasted secret")).contains("secret"));
    }
}
