//! [`Key`]: the holder of a lock.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::clock::{Clock, MonotonicClock};
use crate::error::{Error, Result};

/// The reserved ZSET member marking a write lock on Redis; never a token.
pub const WRITE_MARKER: &str = "__write__";

/// The mode a holder holds a resource in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Shared with other readers.
    Read,
    /// Exclusive.
    Write,
}

/// The holder of a lock on one resource.
///
/// - Two keys for one resource are **two holders**: they exclude each other, also in one process.
/// - Clones of a key, and every [`Lock`](crate::Lock) built from it, are **one holder**:
///   acquiring what it already holds succeeds at once, and one release lets go for all (there is
///   no counting).
/// - A key carries the per-store state that identifies the holder: one random token per store
///   kind (so every Redis store of a quorum sees the same token), and, for stores that hold an
///   open file, process-local state that makes the key [unserializable](Key::to_json).
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
    clock: Arc<dyn Clock>,
    state: Mutex<KeyState>,
    /// Serializes the store operations of this holder (never held across a wait).
    turn: tokio::sync::Mutex<()>,
    /// Counts cancelled acquisitions whose clean-up has not finished yet.
    cleanups: watch::Sender<u32>,
}

#[derive(Default)]
struct KeyState {
    deadline: Option<Instant>,
    tokens: BTreeMap<String, String>,
    /// Process-local state per store instance (an open file), dropped with the key.
    local: HashMap<u64, Box<dyn Any + Send>>,
    unserializable: bool,
    held: Option<Mode>,
    fencing_token: Option<u64>,
    /// Bumped each time an acquisition of this holder completes; lets a cancelled acquisition
    /// tell whether another task of the same holder got the lock meanwhile.
    acquisitions: u64,
}

impl Key {
    /// A new holder for `resource`, on the default monotonic clock.
    pub fn new(resource: impl Into<String>) -> Self {
        Self::with_clock(resource, Arc::new(MonotonicClock))
    }

    /// A new holder for `resource` whose lifetime runs on `clock`.
    pub fn with_clock(resource: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        Self::from_parts(resource.into(), clock, KeyState::default())
    }

    fn from_parts(resource: String, clock: Arc<dyn Clock>, state: KeyState) -> Self {
        let (cleanups, _) = watch::channel(0);
        Key {
            inner: Arc::new(KeyInner {
                resource,
                clock,
                state: Mutex::new(state),
                turn: tokio::sync::Mutex::new(()),
                cleanups,
            }),
        }
    }

    /// The resource this key is for. Any string, the empty one included.
    pub fn resource(&self) -> &str {
        &self.inner.resource
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
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---- per-store state -------------------------------------------------------------------

    /// This holder's token for stores of `kind` (for example `"memory"` or `"redis"`), created on
    /// first use: 32 random bytes in standard base64, 44 characters.
    pub fn token(&self, kind: &str) -> String {
        let mut st = self.state();
        st.tokens
            .entry(kind.to_owned())
            .or_insert_with(new_token)
            .clone()
    }

    /// This holder's id among the holders [`Store::holders`](crate::Store::holders) lists on
    /// stores of `kind` ([`HolderInfo::id`](crate::store::HolderInfo::id)), or `None` before it
    /// has a token for that kind.
    pub fn holder_id(&self, kind: &str) -> Option<String> {
        self.state().tokens.get(kind).map(|t| token_id(t))
    }

    /// Whether this key already has a token for stores of `kind`.
    pub fn has_token(&self, kind: &str) -> bool {
        self.state().tokens.contains_key(kind)
    }

    /// Runs `f` on the process-local state that the store instance `owner` keeps on this key
    /// (for example an open lock file), under the key's state lock: keep `f` short and do not
    /// call other methods of this key from it. State left in the slot stays on the key until it
    /// is taken out or the key (every clone) is dropped.
    ///
    /// State of another type under the same owner is discarded.
    pub fn with_local_state<T: Any + Send, R>(
        &self,
        owner: u64,
        f: impl FnOnce(&mut Option<T>) -> R,
    ) -> R {
        let mut st = self.state();
        let mut slot = st
            .local
            .remove(&owner)
            .and_then(|b| b.downcast::<T>().ok())
            .map(|b| *b);
        let out = f(&mut slot);
        if let Some(value) = slot {
            st.local.insert(owner, Box::new(value));
        }
        out
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
        let candidate = self.inner.clock.now() + d;
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

    // ---- holder bookkeeping (crate-internal) -----------------------------------------------

    /// The deadline, to put back if an operation that reset it did not go through.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.state().deadline
    }

    pub(crate) fn restore_deadline(&self, deadline: Option<Instant>) {
        self.state().deadline = deadline;
    }

    pub(crate) fn held(&self) -> Option<Mode> {
        self.state().held
    }

    pub(crate) fn acquisitions(&self) -> u64 {
        self.state().acquisitions
    }

    /// Records a completed acquisition in `mode`, with the fencing token the store gave.
    pub(crate) fn mark_acquired(&self, mode: Mode, fencing: Option<u64>) {
        let mut st = self.state();
        let was = st.held;
        st.held = Some(mode);
        st.acquisitions += 1;
        // A re-save by the holder that already writes keeps its token (a store may then
        // report none: nothing new was granted).
        let kept = st.fencing_token.filter(|_| was == Some(Mode::Write));
        st.fencing_token = match mode {
            Mode::Write => fencing.or(kept),
            Mode::Read => None,
        };
    }

    /// Records what a store said about holding (`exists`, `put_off`): keeps the mode when still
    /// held.
    pub(crate) fn mark_still_held(&self, held: bool) {
        let mut st = self.state();
        if held {
            st.held.get_or_insert(Mode::Write);
        } else {
            st.held = None;
            st.fencing_token = None;
        }
    }

    pub(crate) fn fencing_token(&self) -> Option<u64> {
        self.state().fencing_token
    }

    /// Takes this holder's turn for one store operation.
    pub(crate) async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        // Clean-ups of cancelled acquisitions go first, so that a delete scheduled by a dropped
        // future never removes what a later acquisition stored.
        let mut rx = self.inner.cleanups.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
        self.inner.turn.lock().await
    }

    /// Takes the turn for a clean-up, ignoring pending clean-ups (it is one of them).
    pub(crate) async fn cleanup_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.turn.lock().await
    }

    pub(crate) fn begin_cleanup(&self) {
        self.inner.cleanups.send_modify(|n| *n += 1);
    }

    pub(crate) fn end_cleanup(&self) {
        self.inner
            .cleanups
            .send_modify(|n| *n = n.saturating_sub(1));
    }

    // ---- serialization ---------------------------------------------------------------------

    /// Serializes the key to JSON: resource, remaining lifetime, tokens.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::UnserializableKey`](crate::ErrorKind::UnserializableKey) once a store has
    /// kept process-local state on it (an open file), even after release.
    pub fn to_json(&self) -> Result<String> {
        let wire = self.to_wire()?;
        serde_json::to_string(&wire).map_err(|e| {
            Error::invalid_argument("cannot serialize the key")
                .with_resource(self.resource())
                .with_source(e)
        })
    }

    /// Reads a key written by [`to_json`](Key::to_json), on the default monotonic clock.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming what is wrong
    /// when the text is not a key, has unknown fields, or carries a malformed token.
    pub fn from_json(s: &str) -> Result<Key> {
        Self::from_json_with_clock(s, Arc::new(MonotonicClock))
    }

    /// Like [`from_json`](Key::from_json), with the lifetime on `clock`.
    pub fn from_json_with_clock(s: &str, clock: Arc<dyn Clock>) -> Result<Key> {
        let wire: WireKey = serde_json::from_str(s).map_err(|e| {
            Error::invalid_argument(format!("malformed serialized key: {e}")).with_source(e)
        })?;
        Self::from_wire(wire, clock)
    }

    fn to_wire(&self) -> Result<WireKey> {
        let st = self.state();
        if st.unserializable {
            return Err(Error::unserializable_key(self.resource()));
        }
        let now = self.inner.clock.now();
        let remaining_ms = st.deadline.map(|d| {
            let ms = d.saturating_duration_since(now).as_millis();
            u64::try_from(ms).unwrap_or(u64::MAX)
        });
        Ok(WireKey {
            v: WIRE_VERSION,
            resource: self.resource().to_owned(),
            remaining_ms,
            tokens: st.tokens.clone(),
        })
    }

    fn from_wire(wire: WireKey, clock: Arc<dyn Clock>) -> Result<Key> {
        if wire.v != WIRE_VERSION {
            return Err(Error::invalid_argument(format!(
                "serialized key has version {}, this library reads version {WIRE_VERSION}",
                wire.v
            )));
        }
        for (kind, token) in &wire.tokens {
            validate_kind(kind)?;
            validate_token(token).map_err(|e| e.with_resource(wire.resource.clone()))?;
        }
        let deadline = wire
            .remaining_ms
            .map(|ms| clock.now() + Duration::from_millis(ms));
        let state = KeyState {
            deadline,
            tokens: wire.tokens,
            ..KeyState::default()
        };
        Ok(Self::from_parts(wire.resource, clock, state))
    }
}

const WIRE_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireKey {
    v: u32,
    resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remaining_ms: Option<u64>,
    #[serde(default)]
    tokens: BTreeMap<String, String>,
}

fn new_token() -> String {
    let mut bytes = [0u8; 32];
    // getrandom only fails where the OS has no CSPRNG at all; no lock can be safe there.
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn validate_kind(kind: &str) -> Result<()> {
    let ok = !kind.is_empty()
        && kind.len() <= 32
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_argument(
            "malformed serialized key: a store kind must be 1 to 32 characters of [a-z0-9_-]",
        ))
    }
}

/// Checks that `token` is a holder token: 44 characters of standard base64 decoding to 32 bytes.
pub fn validate_token(token: &str) -> Result<()> {
    if token == WRITE_MARKER {
        return Err(Error::invalid_argument(
            "malformed serialized key: the write marker is not a token",
        ));
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(token);
    match decoded {
        Ok(bytes) if token.len() == 44 && bytes.len() == 32 => Ok(()),
        _ => Err(Error::invalid_argument(
            "malformed serialized key: a token must be 44 characters of base64 (32 bytes)",
        )),
    }
}

impl Serialize for Key {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let wire = self.to_wire().map_err(serde::ser::Error::custom)?;
        wire.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireKey::deserialize(deserializer)?;
        Key::from_wire(wire, Arc::new(MonotonicClock)).map_err(serde::de::Error::custom)
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
            .field("tokens", &st.tokens.keys().collect::<Vec<_>>())
            .field("held", &st.held)
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
    fn round_trip_keeps_tokens_and_remaining_lifetime() {
        let k = Key::new("reports/nightly");
        let t = k.token("memory");
        k.reduce_lifetime(Duration::from_secs(60));
        let json = k.to_json().unwrap();
        let back = Key::from_json(&json).unwrap();
        assert_eq!(back.resource(), "reports/nightly");
        assert_eq!(back.token("memory"), t);
        let left = back.remaining_lifetime().unwrap();
        assert!(left > Duration::from_secs(59) && left <= Duration::from_secs(60));
        assert!(!Key::same_holder(&k, &back));
        // serde too
        let via_serde: Key = serde_json::from_str(&serde_json::to_string(&k).unwrap()).unwrap();
        assert_eq!(via_serde.token("memory"), t);
    }

    #[test]
    fn a_marked_key_refuses_to_serialize_forever() {
        let k = Key::new("r");
        k.mark_unserializable();
        let err = k.to_json().unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::UnserializableKey);
        assert_eq!(err.resource(), Some("r"));
        assert!(serde_json::to_string(&k).is_err());
        assert!(!k.is_serializable());
    }

    #[test]
    fn tampered_or_malformed_keys_are_refused_clearly() {
        let good = Key::new("r");
        good.token("memory");
        let json = good.to_json().unwrap();
        let cases: Vec<(String, &str)> = vec![
            ("not json".into(), "malformed serialized key"),
            (r#"{"v":1,"resource":5}"#.into(), "malformed serialized key"),
            (
                r#"{"v":1,"resource":null}"#.into(),
                "malformed serialized key",
            ),
            (r#"{"v":1}"#.into(), "missing field `resource`"),
            (r#"{"v":2,"resource":"r"}"#.into(), "version 2"),
            (
                r#"{"v":1,"resource":"r","extra":1}"#.into(),
                "unknown field `extra`",
            ),
            (
                r#"{"v":1,"resource":"r","tokens":{"memory":"short"}}"#.into(),
                "44 characters",
            ),
            (
                r#"{"v":1,"resource":"r","tokens":{"redis":"__write__"}}"#.into(),
                "write marker",
            ),
            (
                r#"{"v":1,"resource":"r","tokens":{"Bad Kind":"x"}}"#.into(),
                "store kind",
            ),
            (
                json.replace("\"memory\":\"", "\"memory\":\"!"),
                "44 characters",
            ),
            (
                r#"{"v":1,"resource":"r","remaining_ms":-5}"#.into(),
                "malformed serialized key",
            ),
        ];
        for (input, want) in cases {
            let err = Key::from_json(&input).unwrap_err();
            assert!(err.is_invalid_argument(), "{input}: {err:?}");
            assert!(err.to_string().contains(want), "{input}: {err}");
        }
        // Missing optional fields are tolerated.
        let k = Key::from_json(r#"{"v":1,"resource":"r"}"#).unwrap();
        assert_eq!(k.remaining_lifetime(), None);
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
