//! [`Key`]: the holder of a lock: identity, tokens, lifetime, and the handles stores keep.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::clock::{Clock, MonotonicClock};
use crate::holder::Holder;
use crate::mutex::lock;
use crate::permits::Permits;

mod wire;

pub use crate::mode::Mode;
#[cfg(any(feature = "sql", feature = "redis"))]
pub(crate) use wire::ANNOUNCING_SUFFIX;
pub use wire::validate_token;

/// The reserved ZSET member marking a write lock on Redis; never a token.
pub(crate) const WRITE_MARKER: &str = "__write__";

/// The store instance a holder's handle belongs to: each store instance that keeps per-holder
/// state beyond a token (an open file, a connection) makes one, and finds its handles on keys by
/// it. Unique within the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandleOwner(u64);

impl HandleOwner {
    /// A new, unique owner.
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        HandleOwner(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for HandleOwner {
    fn default() -> Self {
        Self::new()
    }
}

/// The holder of a lock on one resource.
///
/// - Two keys for one resource are **two holders**: they exclude each other, also in one process.
/// - Clones of a key, and every [`Lock`](crate::Lock) built from it, are **one holder**:
///   acquiring what it already holds succeeds at once, and one release lets go for all (there is
///   no counting).
/// - A key carries what identifies the holder to stores: one random token per store kind (so
///   every Redis store of a quorum sees the same token), and the handles of stores that keep
///   more than a token while the holder holds (an open lock file), which makes the key
///   [unserializable](Key::to_json).
/// - A key has a lifetime on its clock (monotonic by default): stores with expiry shorten it
///   before every round trip, so the local deadline is never later than the store's.
///
/// A serialized key ([`Key::to_json`], or serde) carries the resource, the remaining lifetime and
/// the tokens; deserialized in another process it is the same holder for every store whose state
/// is a token.
#[derive(Clone)]
pub struct Key {
    inner: Arc<KeyInner>,
}

struct KeyInner {
    resource: String,
    /// What a semaphore's holder asks for; `None` for a lock's.
    permits: Option<Permits>,
    clock: Arc<dyn Clock>,
    state: Mutex<KeyState>,
    /// What the locks of this holder believe about it (the lock's bookkeeping, not the key's).
    holder: Holder,
}

#[derive(Default)]
struct KeyState {
    deadline: Option<Instant>,
    /// While a renewal is in flight: the deadline before it, the last one the store confirmed.
    renewing: Option<Option<Instant>>,
    /// Per store kind, its token: a list (nearly always of one), not a map, whose node would
    /// be most of a held lock's memory.
    tokens: Vec<(String, String)>,
    /// Per store instance: the handle it keeps for this holder, dropped with the key.
    handles: HashMap<HandleOwner, Arc<dyn Any + Send + Sync>>,
    unserializable: bool,
    /// The holder's metadata, stored beside its lock by the next save.
    meta: Option<Arc<[u8]>>,
}

impl KeyState {
    /// The last deadline the store confirmed. During a renewal, the one from before it (a
    /// renewal that never lands must not lengthen what the holder believes), or the new one
    /// if that is sooner (a shortening renewal may have landed unanswered).
    fn confirmed_deadline(&self) -> Option<Instant> {
        match (self.renewing, self.deadline) {
            (None, deadline) => deadline,
            (Some(Some(before)), Some(new)) => Some(before.min(new)),
            (Some(before), new) => before.or(new),
        }
    }
}

impl Key {
    /// A new holder for `resource`, on the default monotonic clock.
    pub fn new(resource: impl Into<String>) -> Self {
        Self::with_clock(resource, Arc::new(MonotonicClock))
    }

    /// A new holder for `resource` whose lifetime runs on `clock`.
    pub fn with_clock(resource: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        Self::from_parts(resource.into(), None, clock, KeyState::default())
    }

    /// A new holder of `permits` of the semaphore `resource`, on the default monotonic clock
    /// (a [`Semaphore`](crate::Semaphore)'s key). Stores keep semaphores apart from locks: a
    /// semaphore and a lock of one name do not exclude each other.
    pub fn for_semaphore(resource: impl Into<String>, permits: Permits) -> Self {
        Self::for_semaphore_with_clock(resource, permits, Arc::new(MonotonicClock))
    }

    /// Like [`for_semaphore`](Key::for_semaphore), with the lifetime on `clock`.
    pub fn for_semaphore_with_clock(
        resource: impl Into<String>,
        permits: Permits,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::from_parts(resource.into(), Some(permits), clock, KeyState::default())
    }

    fn from_parts(
        resource: String,
        permits: Option<Permits>,
        clock: Arc<dyn Clock>,
        state: KeyState,
    ) -> Self {
        Key {
            inner: Arc::new(KeyInner {
                resource,
                permits,
                clock,
                state: Mutex::new(state),
                holder: Holder::new(),
            }),
        }
    }

    /// The resource this key is for. Any string, the empty one included.
    pub fn resource(&self) -> &str {
        &self.inner.resource
    }

    /// The permits this holder takes, for a semaphore's key; `None` for a lock's.
    pub fn permits(&self) -> Option<Permits> {
        self.inner.permits
    }

    /// The holder's metadata ([`set_meta`](Key::set_meta)), if any.
    pub fn meta(&self) -> Option<Arc<[u8]>> {
        self.state().meta.clone()
    }

    /// Sets the small value stores keep beside this holder's lock (who it is: a host, a
    /// process, a job; an election candidate's proposal), shown by
    /// [`Store::holders`](crate::Store::holders) and [`Store::list`](crate::Store::list) on
    /// stores with [`Capabilities::metadata`](crate::store::Capabilities::metadata). It is
    /// stored by the next save (a re-save of a held lock replaces it); it travels with the
    /// serialized key. Never put credentials in it: anyone who can list the store reads it.
    ///
    /// # Errors
    ///
    /// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) above
    /// [`MAX_META`](crate::MAX_META) bytes.
    pub fn set_meta(&self, meta: Option<Vec<u8>>) -> crate::Result<()> {
        if let Some(m) = &meta {
            check_meta(m).map_err(|e| e.with_resource(self.resource()))?;
        }
        self.state().meta = meta.map(Arc::from);
        Ok(())
    }

    /// The same holder carrying `meta` (see [`set_meta`](Key::set_meta)).
    ///
    /// # Errors
    ///
    /// As [`set_meta`](Key::set_meta).
    pub fn with_meta(self, meta: impl Into<Vec<u8>>) -> crate::Result<Self> {
        self.set_meta(Some(meta.into()))?;
        Ok(self)
    }

    /// The clock the lifetime runs on.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// Whether `a` and `b` are the same holder (clones of one key).
    pub fn same_holder(a: &Key, b: &Key) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }

    fn state(&self) -> MutexGuard<'_, KeyState> {
        lock(&self.inner.state)
    }

    /// What the locks of this holder believe about it.
    pub(crate) fn holder(&self) -> &Holder {
        &self.inner.holder
    }

    // ---- tokens ----------------------------------------------------------------------------

    /// This holder's token for stores of `kind` (for example `"memory"` or `"redis"`), created on
    /// first use: 32 random bytes in standard base64, 44 characters.
    pub fn token(&self, kind: &str) -> String {
        let mut st = self.state();
        if let Some((_, token)) = st.tokens.iter().find(|(k, _)| k == kind) {
            return token.clone();
        }
        let token = wire::new_token();
        st.tokens.reserve_exact(1);
        st.tokens.push((kind.to_owned(), token.clone()));
        token
    }

    /// This holder's id among the holders [`Store::holders`](crate::Store::holders) lists on
    /// stores of `kind` ([`HolderInfo::id`](crate::store::HolderInfo::id)), or `None` before it
    /// has a token for that kind.
    pub fn holder_id(&self, kind: &str) -> Option<String> {
        self.state()
            .tokens
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, t)| token_id(t))
    }

    /// Forgets every token: the key is a new holder for every store from now on (its next
    /// save makes new tokens). What a release that leaves its lock to run out does, so that
    /// nothing of this holder finds that lock again.
    pub(crate) fn forget_tokens(&self) {
        self.state().tokens.clear();
    }

    /// Whether this key already has a token for stores of `kind`.
    pub fn has_token(&self, kind: &str) -> bool {
        self.state().tokens.iter().any(|(k, _)| k == kind)
    }

    // ---- handles ---------------------------------------------------------------------------

    /// The handle that the store instance `owner` keeps for this holder, made with
    /// `H::default()` on first use. `H` is the store's own type, with the interior mutability
    /// it needs (a `std::sync::Mutex` around an open file, a `tokio::sync::Mutex` around a
    /// connection that must be used across awaits).
    ///
    /// Clones of the key share the handle. It lives until [`take_handle`](Key::take_handle) or
    /// until the last clone of the key is dropped; its `Drop` must then let go of what it holds.
    /// It must not hold a strong reference to the key. A handle of another type under the same
    /// owner is replaced.
    pub fn handle<H: Default + Send + Sync + 'static>(&self, owner: HandleOwner) -> Arc<H> {
        let mut st = self.state();
        if let Some(found) = st.handles.get(&owner)
            && let Ok(handle) = Arc::clone(found).downcast::<H>()
        {
            return handle;
        }
        let handle = Arc::new(H::default());
        st.handles.insert(owner, handle.clone());
        handle
    }

    /// The handle of `owner`, if it has one of type `H`, without making one.
    pub fn existing_handle<H: Send + Sync + 'static>(&self, owner: HandleOwner) -> Option<Arc<H>> {
        let found = self.state().handles.get(&owner).cloned()?;
        found.downcast::<H>().ok()
    }

    /// Takes the handle of `owner` off the key; it is dropped when the returned `Arc` (and any
    /// other clone of it) goes.
    pub fn take_handle<H: Send + Sync + 'static>(&self, owner: HandleOwner) -> Option<Arc<H>> {
        let found = self.state().handles.remove(&owner)?;
        found.downcast::<H>().ok()
    }

    /// Marks the key as holding process-local state (an open file): from now on it refuses to
    /// serialize, permanently.
    pub fn mark_unserializable(&self) {
        self.state().unserializable = true;
    }

    /// Whether the key refuses to serialize.
    pub fn is_serializable(&self) -> bool {
        !self.state().unserializable
    }

    // ---- lifetime --------------------------------------------------------------------------

    /// Shortens the lifetime to now + `d` if no deadline is set or if that is earlier. It only
    /// ever shortens; `Duration::ZERO` expires the key at once.
    pub fn reduce_lifetime(&self, d: Duration) {
        self.reduce_deadline(later(self.inner.clock.now(), d));
    }

    /// Shortens the lifetime to end at `candidate` (on the key's clock) if no deadline is set
    /// or if that is earlier.
    pub(crate) fn reduce_deadline(&self, candidate: Instant) {
        let mut st = self.state();
        st.deadline = Some(match st.deadline {
            Some(current) if current <= candidate => current,
            _ => candidate,
        });
    }

    /// Clears the deadline.
    pub fn reset_lifetime(&self) {
        self.state().deadline = None;
    }

    /// The time left before the deadline: `None` without a deadline, `Some(ZERO)` once past.
    /// The store's working view: during a renewal, the deadline the renewal is setting, not yet
    /// confirmed; [`Lockable::remaining_lifetime`](crate::Lockable::remaining_lifetime) tells
    /// the confirmed one.
    pub fn remaining_lifetime(&self) -> Option<Duration> {
        let deadline = self.state().deadline?;
        Some(deadline.saturating_duration_since(self.inner.clock.now()))
    }

    /// Whether a deadline is set and has been reached (inclusive).
    pub fn is_expired(&self) -> bool {
        match self.state().deadline {
            Some(deadline) => deadline <= self.inner.clock.now(),
            None => false,
        }
    }

    /// The deadline, to put back if an operation that reset it did not go through.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.state().deadline
    }

    pub(crate) fn restore_deadline(&self, deadline: Option<Instant>) {
        self.state().deadline = deadline;
    }

    /// Starts a renewal: the deadline is cleared for the store to set anew, while
    /// [`confirmed_lifetime`](Key::confirmed_lifetime) keeps reporting the one from before
    /// until [`end_renewal`](Key::end_renewal) says whether the store confirmed the new one.
    pub(crate) fn begin_renewal(&self) {
        let mut st = self.state();
        st.renewing = Some(st.deadline.take());
    }

    /// Ends a renewal: confirmed, the deadline the store set stands; not, the one from before
    /// is put back (the lease the store knows is still the old one), or the new one if that is
    /// sooner (a shortening renewal may have landed unanswered).
    pub(crate) fn end_renewal(&self, confirmed: bool) {
        let mut st = self.state();
        if !confirmed {
            st.deadline = st.confirmed_deadline();
        }
        st.renewing = None;
    }

    /// The time left before the last deadline the store confirmed (see
    /// `KeyState::confirmed_deadline`).
    pub(crate) fn confirmed_lifetime(&self) -> Option<Duration> {
        let deadline = self.state().confirmed_deadline()?;
        Some(deadline.saturating_duration_since(self.inner.clock.now()))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.resource())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state();
        // Tokens identify the holder: whoever reads them can release the lock, so they stay out
        // of logs. Only the store kinds are shown.
        f.debug_struct("Key")
            .field("resource", &self.inner.resource)
            .field("permits", &self.inner.permits)
            .field(
                "tokens",
                &st.tokens.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("held", &self.inner.holder.mode())
            .field("serializable", &!st.unserializable)
            .finish_non_exhaustive()
    }
}

/// 12 hex digits of the SHA-256 of a holder token: tells holders apart without giving the token
/// (a bearer credential) away.
pub(crate) fn token_id(token: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(token.as_bytes())[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `now + d`, or as late as [`MAX_DURATION`](crate::MAX_DURATION) allows where that overflows
/// (callers bound durations before they get here; a store used directly may not).
pub(crate) fn later(now: std::time::Instant, d: Duration) -> std::time::Instant {
    now.checked_add(d.min(crate::limits::MAX_DURATION))
        .unwrap_or(now)
}

/// Checks a holder's metadata: at most [`MAX_META`](crate::MAX_META) bytes.
///
/// # Errors
///
/// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) naming the size and the cap.
pub(crate) fn check_meta(meta: &[u8]) -> crate::Result<()> {
    if meta.len() > crate::limits::MAX_META {
        return Err(crate::Error::invalid_argument(format!(
            "holder metadata is {} bytes, at most {} are kept",
            meta.len(),
            crate::limits::MAX_META
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn key_on(clock: &ManualClock) -> Key {
        Key::with_clock("r", Arc::new(clock.clone()))
    }

    #[test]
    fn display_is_the_resource() {
        assert_eq!(Key::new("reports").to_string(), "reports");
        assert_eq!(Key::new("").to_string(), "");
    }

    #[test]
    fn tokens_are_stable_per_kind_and_distinct_between_keys() {
        let a = Key::new("r");
        let b = Key::new("r");
        assert!(!a.has_token("memory"));
        let t = a.token("memory");
        assert!(a.has_token("memory"));
        assert_eq!(t, a.token("memory"));
        assert_eq!(t, a.clone().token("memory"));
        assert_ne!(t, b.token("memory"));
        assert_ne!(t, a.token("redis"));
        assert_eq!(t.len(), 44);
        assert!(t.ends_with('='));
        validate_token(&t).unwrap();
    }

    #[test]
    fn handles_are_per_owner_shared_by_clones_and_dropped_with_the_key() {
        struct Probe(Arc<AtomicU64>);
        impl Default for Probe {
            fn default() -> Self {
                Probe(Arc::new(AtomicU64::new(0)))
            }
        }
        let (a, b) = (HandleOwner::new(), HandleOwner::new());
        let key = Key::new("r");
        let h = key.handle::<Probe>(a);
        h.0.store(7, Ordering::SeqCst);
        assert_eq!(key.clone().handle::<Probe>(a).0.load(Ordering::SeqCst), 7);
        assert_eq!(key.handle::<Probe>(b).0.load(Ordering::SeqCst), 0);
        assert!(key.existing_handle::<Probe>(a).is_some());
        let weak = Arc::downgrade(&h);
        drop(h);
        drop(key);
        assert!(weak.upgrade().is_none(), "the handle went with the key");

        let key = Key::new("r");
        key.handle::<Probe>(a);
        assert!(key.take_handle::<Probe>(a).is_some());
        assert!(key.existing_handle::<Probe>(a).is_none());
        assert!(key.take_handle::<Probe>(a).is_none());
    }

    #[test]
    fn new_key_has_no_lifetime() {
        let k = Key::new("r");
        assert_eq!(k.remaining_lifetime(), None);
        assert!(!k.is_expired());
    }

    #[test]
    fn reduce_only_shortens_and_reset_clears() {
        let c = ManualClock::new();
        let k = key_on(&c);
        k.reduce_lifetime(Duration::from_secs(10));
        assert_eq!(k.remaining_lifetime(), Some(Duration::from_secs(10)));
        k.reduce_lifetime(Duration::from_secs(20));
        assert_eq!(k.remaining_lifetime(), Some(Duration::from_secs(10)));
        k.reduce_lifetime(Duration::from_secs(5));
        assert_eq!(k.remaining_lifetime(), Some(Duration::from_secs(5)));
        k.reset_lifetime();
        assert_eq!(k.remaining_lifetime(), None);
        k.reduce_lifetime(Duration::ZERO);
        assert!(k.is_expired());
    }

    #[test]
    fn expiry_is_inclusive_at_the_deadline() {
        let c = ManualClock::new();
        let k = key_on(&c);
        k.reduce_lifetime(Duration::from_secs(5));
        c.advance(Duration::from_millis(4_999));
        assert!(!k.is_expired());
        assert_eq!(k.remaining_lifetime(), Some(Duration::from_millis(1)));
        c.advance(Duration::from_millis(1));
        assert!(k.is_expired());
        assert_eq!(k.remaining_lifetime(), Some(Duration::ZERO));
        c.advance(Duration::from_secs(1));
        assert!(k.is_expired());
    }

    #[test]
    fn debug_never_shows_tokens() {
        let k = Key::new("r");
        let t = k.token("redis");
        assert!(!format!("{k:?}").contains(&t));
    }

    #[test]
    fn lifetime_is_monotonic_whatever_the_wall_clock_does() {
        // The key reads only its monotonic clock; a manual clock stands for "no wall clock".
        let c = ManualClock::new();
        let k = key_on(&c);
        k.reduce_lifetime(Duration::from_secs(10));
        c.advance(Duration::from_secs(3));
        assert_eq!(k.remaining_lifetime(), Some(Duration::from_secs(7)));
    }
}
