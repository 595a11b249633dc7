//! [`StoreWarning`]: what a store's pre-flight check ([`Store::check`](super::Store::check))
//! found about its server that can make it drop locks behind their holders' backs.

use std::fmt;

/// How much a [`StoreWarning`] matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Severity {
    /// The server is set up so that it can drop a held lock, or cannot be asked whether it is
    /// (keys evicted under memory pressure, a fail-over that loses writes, a replica). Shown by
    /// `xtr-lock config check --ping` and by `-v`.
    Warning,
    /// True of every server run this way and often chosen on purpose, worth knowing but no
    /// misconfiguration (a server without persistence empties on restart). Shown only by `-v`.
    Note,
}

/// One finding of a store's pre-flight check: what is wrong, why it endangers locks, and what
/// to do, for people (`Display` is one line) and for programs ([`code`](Self::code)).
///
/// It names the store by its credential-free id and quotes only the server's settings
/// (a policy's name, a role), never a DSN or a credential.
///
/// # Examples
///
/// ```
/// use xtr_lock::store::{Severity, StoreWarning};
///
/// let w = StoreWarning::new(
///     "eviction",
///     "maxmemory-policy is allkeys-lru",
///     "under memory pressure Redis evicts any key, locks included",
///     "set maxmemory-policy noeviction",
/// )
/// .with_store("redis://db:6379/0");
/// assert_eq!(w.severity(), Severity::Warning);
/// assert_eq!(
///     w.to_string(),
///     "redis://db:6379/0: maxmemory-policy is allkeys-lru: under memory pressure Redis evicts \
///      any key, locks included; set maxmemory-policy noeviction"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreWarning {
    code: &'static str,
    severity: Severity,
    store: String,
    problem: String,
    risk: String,
    remedy: String,
}

impl StoreWarning {
    /// A [warning](Severity::Warning): `code` a short stable word for programs (`eviction`),
    /// `problem` what is wrong, `risk` why it endangers locks, `remedy` what to do. Each a
    /// clause without a trailing period.
    pub fn new(
        code: &'static str,
        problem: impl Into<String>,
        risk: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Self {
        StoreWarning {
            code,
            severity: Severity::Warning,
            store: String::new(),
            problem: problem.into(),
            risk: risk.into(),
            remedy: remedy.into(),
        }
    }

    /// The same, as a [note](Severity::Note).
    #[must_use]
    pub fn note(mut self) -> Self {
        self.severity = Severity::Note;
        self
    }

    /// Names the store (or the quorum's member) it is about: its `Display`, which never holds a
    /// credential.
    #[must_use]
    pub fn with_store(mut self, store: impl fmt::Display) -> Self {
        self.store = store.to_string();
        self
    }

    /// A short stable word saying what kind of finding it is: `eviction`, `replication`,
    /// `replica`, `persistence`, `cluster`, `unchecked` (the server refused a question),
    /// `member` (a quorum's member could not be checked).
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// How much it matters.
    pub fn severity(&self) -> Severity {
        self.severity
    }

    /// The store (or quorum member) it is about; empty when not named.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// What is wrong.
    pub fn problem(&self) -> &str {
        &self.problem
    }

    /// Why it endangers locks.
    pub fn risk(&self) -> &str {
        &self.risk
    }

    /// What to do.
    pub fn remedy(&self) -> &str {
        &self.remedy
    }
}

/// `store: problem: risk; remedy`, one line (without `store: ` when none is named).
impl fmt::Display for StoreWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.store.is_empty() {
            write!(f, "{}: ", self.store)?;
        }
        write!(f, "{}: {}; {}", self.problem, self.risk, self.remedy)
    }
}
