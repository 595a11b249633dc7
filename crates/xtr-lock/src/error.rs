//! The one error type of the crate.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// A boxed error from a store's backend, chained as the [`source`](StdError::source).
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Shorthand for `Result<T, xtr_lock::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, in the taxonomy shared with the Python and PHP peers.
///
/// "Held by someone else" on a non-blocking attempt is not an error at the [`Lock`](crate::Lock)
/// level: it is `Ok(false)`. Stores report it as a value ([`Saved::Conflict`](crate::store::Saved),
/// [`Holding::NotHeld`](crate::store::Holding)), not as an error. [`ErrorKind::Conflict`] is
/// what a lock reports when a wait ran out (`acquire_timeout` through [`LockFactory::run`](crate::LockFactory::run)
/// and the blocking API), or a holder that never held is refreshed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Another holder holds an incompatible lock, or this holder no longer holds.
    Conflict,
    /// Acquiring or refreshing failed for a reason other than a conflict; the cause is chained.
    Acquiring,
    /// The lifetime ran out before the store confirmed; what was stored has been taken back.
    Expired,
    /// Releasing failed; the cause is chained.
    Releasing,
    /// The backend answered with an error or could not be reached.
    Storage,
    /// Bad configuration or arguments (a DSN, a tampered serialized key, a missing duration).
    InvalidArgument,
    /// A lifetime that is zero (durations cannot be negative in Rust). Also an invalid argument.
    InvalidTtl,
    /// The key holds state its store keeps in this process only, so it cannot be serialized.
    UnserializableKey,
    /// The store cannot do what was asked (see [`Capabilities`](crate::store::Capabilities)).
    Unsupported,
    /// The lock was lost while its holder believed it held it (deleted, expired, taken over, its
    /// file replaced, its connection closed): work done since was not protected by it.
    /// [`Error::lost_reason`] says why.
    Lost,
}

impl ErrorKind {
    /// A short lowercase name, used in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Conflict => "conflict",
            ErrorKind::Acquiring => "acquiring",
            ErrorKind::Expired => "expired",
            ErrorKind::Releasing => "releasing",
            ErrorKind::Storage => "storage",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidTtl => "invalid ttl",
            ErrorKind::UnserializableKey => "unserializable key",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Lost => "lost",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a holder no longer holds a lock it held, as far as the store could tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// Nothing of the holder is stored any more: deleted by someone, flushed, evicted, or
    /// expired and cleaned up.
    Removed,
    /// Its lease ran out before it was renewed.
    Expired,
    /// Another holder holds the resource now.
    TakenOver,
    /// Its lock file was unlinked or replaced: the name now locks another file.
    Replaced,
    /// The store could not be reached until the lease ran out.
    Unreachable,
    /// The connection or session that held the lock closed.
    Disconnected,
    /// Someone asked every holder to give it up ([`Lock::revoke`](crate::Lock::revoke), `xtr-lock
    /// revoke`, `run --on-conflict replace`); the holder's work is stopped and the lock
    /// released.
    Revoked,
    /// Held as long as it may be ([`Lock::with_max_hold`](crate::Lock::with_max_hold),
    /// [`with_max_renewals`](crate::Lock::with_max_renewals)): not renewed further; the
    /// holder's work is stopped and the lock released. Not a loss to anyone else: the lock was
    /// still held when its holder was told.
    HeldTooLong,
}

impl LostReason {
    /// What happened, in a few lowercase words: `someone else holds it now`.
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::Removed => "it was removed from the store",
            LostReason::Expired => "its lifetime ran out before it was renewed",
            LostReason::TakenOver => "someone else holds it now",
            LostReason::Replaced => "its lock file was removed or replaced",
            LostReason::Unreachable => "the store could not be reached before its lifetime ran out",
            LostReason::Disconnected => "the connection that held it closed",
            LostReason::Revoked => "it was revoked: someone asked its holders to give it up",
            LostReason::HeldTooLong => "it was held for as long as it may be (its maximum hold)",
        }
    }
}

impl LostReason {
    /// The reason as one word, for logs, metrics and machine-readable output: `removed`,
    /// `expired`, `taken_over`, `replaced`, `unreachable`, `disconnected`, `revoked`,
    /// `held_too_long`.
    pub fn label(self) -> &'static str {
        match self {
            LostReason::Removed => "removed",
            LostReason::Expired => "expired",
            LostReason::TakenOver => "taken_over",
            LostReason::Replaced => "replaced",
            LostReason::Unreachable => "unreachable",
            LostReason::Disconnected => "disconnected",
            LostReason::Revoked => "revoked",
            LostReason::HeldTooLong => "held_too_long",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of every fallible operation in this crate.
///
/// It carries a [`kind`](Error::kind), the resource and the store id where they are known,
/// the backend's error as its [`source`](StdError::source), and a [`temporary`](Error::is_temporary)
/// hint. Its message is one lowercase line and never contains credentials: stores only ever
/// hand their credential-free id to it.
pub struct Error {
    kind: ErrorKind,
    resource: Option<String>,
    store: Option<String>,
    reason: Option<String>,
    temporary: bool,
    lost: Option<LostReason>,
    /// A conflict that is not someone else's hold: this holder does not hold the lock.
    unheld: bool,
    source: Option<BoxError>,
}

/// At most this many characters of a resource name appear in a message; the full name stays
/// available through [`Error::resource`].
const SHOWN_RESOURCE_CHARS: usize = 120;

pub(crate) struct ShownResource<'a>(pub(crate) &'a str);

impl fmt::Display for ShownResource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("'")?;
        let mut chars = self.0.chars();
        for c in chars.by_ref().take(SHOWN_RESOURCE_CHARS) {
            // One line, whatever the resource holds: control characters and quotes are escaped.
            if c == '\'' || c == '\\' || c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        if chars.next().is_some() {
            f.write_str("…")?;
        }
        f.write_str("'")
    }
}

impl Error {
    /// A new error of `kind`. Use the named constructors where one fits.
    pub fn new(kind: ErrorKind) -> Self {
        Error {
            kind,
            resource: None,
            store: None,
            reason: None,
            temporary: false,
            lost: None,
            unheld: false,
            source: None,
        }
    }

    /// "Held by someone else" for `resource`.
    pub fn conflict(resource: impl Into<String>) -> Self {
        Error::new(ErrorKind::Conflict).with_resource(resource)
    }

    /// "Not held by this holder" for `resource`: a [`Conflict`](ErrorKind::Conflict) of a holder
    /// that never held the lock or has released it (a refresh then), whoever else holds it.
    pub fn not_held(resource: impl Into<String>) -> Self {
        let mut err = Error::conflict(resource);
        err.unheld = true;
        err
    }

    /// The lifetime of the lock on `resource` ran out before the store confirmed it.
    pub fn expired(resource: impl Into<String>) -> Self {
        Error::new(ErrorKind::Expired).with_resource(resource)
    }

    /// The lock on `resource` was lost while believed held, for `reason`.
    pub fn lost(resource: impl Into<String>, reason: LostReason) -> Self {
        let mut err = Error::new(ErrorKind::Lost).with_resource(resource);
        err.lost = Some(reason);
        err
    }

    /// The backend failed; `reason` is one line without credentials.
    pub fn storage(reason: impl Into<String>) -> Self {
        Error::new(ErrorKind::Storage).with_reason(reason)
    }

    /// Bad configuration or arguments; `reason` is one line without credentials.
    pub fn invalid_argument(reason: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument).with_reason(reason)
    }

    /// A lifetime that is not strictly positive, or longer than
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn invalid_ttl(ttl: Duration) -> Self {
        let reason = if ttl > crate::limits::MAX_DURATION {
            format!(
                "a lock lifetime must be at most 3650 days, got {} seconds",
                ttl.as_secs()
            )
        } else {
            format!(
                "a lock lifetime must be strictly positive, got {} seconds",
                ttl.as_secs_f64()
            )
        };
        Error::new(ErrorKind::InvalidTtl).with_reason(reason)
    }

    /// The store cannot do `what`.
    pub fn unsupported(what: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unsupported).with_reason(what)
    }

    /// The key for `resource` holds process-local state.
    pub fn unserializable_key(resource: impl Into<String>) -> Self {
        Error::new(ErrorKind::UnserializableKey).with_resource(resource)
    }

    /// Sets the resource the error is about.
    pub fn with_resource(mut self, resource: impl Into<String>) -> Self {
        self.resource = Some(resource.into());
        self
    }

    /// Sets the id of the store the error comes from (its `Display`, never a credential).
    pub fn with_store(mut self, store: impl fmt::Display) -> Self {
        self.store = Some(store.to_string());
        self
    }

    /// Sets the human reason, one line without credentials.
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Chains the underlying error.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Marks the error as temporary: retrying the same operation later may succeed.
    pub fn temporary(mut self) -> Self {
        self.temporary = true;
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The resource, where known.
    pub fn resource(&self) -> Option<&str> {
        self.resource.as_deref()
    }

    /// The store id, where known.
    pub fn store(&self) -> Option<&str> {
        self.store.as_deref()
    }

    /// The reason given by whoever raised the error, if any.
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// Whether retrying later may succeed (a refused connection, a timeout).
    pub fn is_temporary(&self) -> bool {
        self.temporary
    }

    /// For a [`Lost`](ErrorKind::Lost) error: why the lock was lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.lost
    }

    /// Whether this is a conflict ("held by someone else", or "no longer held by us").
    pub fn is_conflict(&self) -> bool {
        self.kind == ErrorKind::Conflict
    }

    /// Whether the lock was lost while believed held ([`ErrorKind::Lost`]).
    pub fn is_lost(&self) -> bool {
        self.kind == ErrorKind::Lost
    }

    /// Whether this is an expiry.
    pub fn is_expired(&self) -> bool {
        self.kind == ErrorKind::Expired
    }

    /// Whether this is an invalid argument, an invalid ttl included.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::InvalidArgument | ErrorKind::InvalidTtl
        )
    }

    /// Wraps `cause` into an error of `kind` about `resource`, giving `reason`; the store id and
    /// temporary flag of the cause carry over.
    pub(crate) fn wrap(kind: ErrorKind, resource: &str, reason: &str, cause: Error) -> Error {
        Error {
            kind,
            resource: Some(resource.to_owned()),
            store: cause.store.clone(),
            reason: Some(reason.to_owned()),
            temporary: cause.temporary,
            lost: None,
            unheld: false,
            source: Some(Box::new(cause)),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let resource = self.resource.as_deref().map(ShownResource);
        match (self.kind, &resource, &self.reason) {
            (ErrorKind::Conflict, Some(r), None) if self.unheld => {
                write!(
                    f,
                    "lock {r} is not held by this holder (never acquired, or released)"
                )
            }
            (ErrorKind::Conflict, Some(r), None) => write!(f, "lock {r} is held by someone else"),
            (ErrorKind::Conflict, Some(r), Some(reason)) => {
                write!(f, "lock {r} is held by someone else; {reason}")
            }
            (ErrorKind::Lost, Some(r), _) => match self.lost {
                Some(why) => write!(f, "lock {r} was lost: {why}"),
                None => write!(f, "lock {r} was lost"),
            },
            (ErrorKind::Expired, Some(r), _) => {
                write!(f, "lock {r} expired before the store could confirm it")
            }
            (ErrorKind::UnserializableKey, Some(r), _) => write!(
                f,
                "the key for {r} holds state its store keeps in this process only, so it cannot be serialized"
            ),
            (ErrorKind::Acquiring, Some(r), None) => {
                write!(f, "lock {r}: failed to acquire the lock")
            }
            (ErrorKind::Releasing, Some(r), None) => {
                write!(f, "lock {r}: failed to release the lock")
            }
            (_, Some(r), Some(reason)) => write!(f, "lock {r}: {reason}"),
            (_, None, Some(reason)) => f.write_str(reason),
            (kind, Some(r), None) => write!(f, "lock {r}: {kind} error"),
            (kind, None, None) => write!(f, "{kind} error"),
        }?;
        // Storage and unsupported errors are about a store; say which one.
        if let (ErrorKind::Storage | ErrorKind::Unsupported, Some(store)) = (self.kind, &self.store)
        {
            write!(f, " (store {store})")?;
        }
        Ok(())
    }
}

/// `{:?}` is the message and its causes on one line, each once (a [`Report`](crate::Report)):
/// what `fn main() -> xtr_lock::Result<()>` and `unwrap` print. `{:#?}` is the structure: kind,
/// resource, store, reason, flags and the source's own `Debug`.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !f.alternate() {
            return fmt::Display::fmt(&crate::report::Report::new(self), f);
        }
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind);
        if let Some(r) = &self.resource {
            d.field("resource", r);
        }
        if let Some(s) = &self.store {
            d.field("store", s);
        }
        if let Some(r) = &self.reason {
            d.field("reason", r);
        }
        if self.temporary {
            d.field("temporary", &true);
        }
        if let Some(why) = &self.lost {
            d.field("lost", why);
        }
        if self.unheld {
            d.field("unheld", &true);
        }
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_lowercase_line() {
        let cases = [
            (Error::conflict("r"), "lock 'r' is held by someone else"),
            (
                Error::expired("r"),
                "lock 'r' expired before the store could confirm it",
            ),
            (
                Error::wrap(
                    ErrorKind::Acquiring,
                    "r",
                    "failed to acquire the lock",
                    Error::storage("boom"),
                ),
                "lock 'r': failed to acquire the lock",
            ),
            (
                Error::invalid_ttl(Duration::ZERO),
                "a lock lifetime must be strictly positive, got 0 seconds",
            ),
            (
                Error::storage("connection refused").with_store("redis://h:6379/0"),
                "connection refused (store redis://h:6379/0)",
            ),
            (
                Error::lost("r", LostReason::TakenOver),
                "lock 'r' was lost: someone else holds it now",
            ),
            (
                Error::not_held("r"),
                "lock 'r' is not held by this holder (never acquired, or released)",
            ),
            (
                Error::conflict("a\nb'c"),
                "lock 'a\\nb\\'c' is held by someone else",
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn long_resources_are_shortened_in_messages_only() {
        let long = "x".repeat(10_000);
        let err = Error::conflict(long.clone());
        let msg = err.to_string();
        assert!(msg.len() < 200, "{msg}");
        assert!(msg.contains('…'));
        assert_eq!(err.resource(), Some(long.as_str()));
    }

    #[test]
    fn source_is_chained_and_flags_carry_over() {
        let cause = Error::storage("timeout").with_store("s").temporary();
        let err = Error::wrap(
            ErrorKind::Acquiring,
            "r",
            "failed to acquire the lock",
            cause,
        );
        assert!(err.is_temporary());
        assert_eq!(err.store(), Some("s"));
        let src = err.source().expect("chained");
        assert_eq!(src.to_string(), "timeout (store s)");
    }

    /// What `fn main() -> xtr_lock::Result<()>` prints after `Error: `: one line with the
    /// cause, not a dump of the struct; `{:#?}` keeps the structure.
    #[test]
    fn debug_is_one_line_with_the_causes_and_alternate_debug_the_structure() {
        let cause = Error::storage("cannot reach the server: connection refused")
            .with_store("redis://h:1/0")
            .temporary();
        let err = Error::wrap(
            ErrorKind::Acquiring,
            "r",
            "failed to acquire the lock",
            cause,
        );
        assert_eq!(
            format!("{err:?}"),
            "lock 'r': failed to acquire the lock: cannot reach the server: connection refused \
             (store redis://h:1/0)"
        );
        let structure = format!("{err:#?}");
        assert!(
            structure.contains("kind: Acquiring") && structure.contains("temporary: true"),
            "{structure}"
        );
    }

    #[test]
    fn invalid_ttl_is_an_invalid_argument() {
        assert!(Error::invalid_ttl(Duration::ZERO).is_invalid_argument());
        assert!(Error::invalid_argument("x").is_invalid_argument());
        assert!(!Error::conflict("x").is_invalid_argument());
    }
}
