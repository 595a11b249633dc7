//! The serialized form of a key (JSON, versioned): resource, remaining lifetime, tokens.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{Key, KeyState, WRITE_MARKER};
use crate::clock::{Clock, MonotonicClock};
use crate::error::{Error, Result};

impl Key {
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
        // During a renewal, the deadline the store confirmed last: the new one may never land
        // (or, if sooner, may have).
        let remaining_ms = st.confirmed_deadline().map(|d| {
            let ms = d.saturating_duration_since(now).as_millis();
            u64::try_from(ms).unwrap_or(u64::MAX)
        });
        Ok(WireKey {
            v: WIRE_VERSION,
            resource: self.resource().to_owned(),
            permits: self.permits(),
            remaining_ms,
            tokens: st.tokens.iter().cloned().collect(),
            meta: st
                .meta
                .as_ref()
                .map(|m| base64::engine::general_purpose::STANDARD.encode(m)),
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
        // Checked on the way in (`Permits` deserializes through its constructor).
        let permits = wire.permits;
        let deadline = wire
            .remaining_ms
            .map(|ms| super::later(clock.now(), Duration::from_millis(ms)));
        let meta = match wire.meta {
            Some(m) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(m)
                    .map_err(|_| {
                        Error::invalid_argument("malformed serialized key: meta is not base64")
                    })?;
                super::check_meta(&bytes)?;
                Some(Arc::from(bytes))
            }
            None => None,
        };
        let state = KeyState {
            deadline,
            tokens: wire.tokens.into_iter().collect(),
            meta,
            ..KeyState::default()
        };
        Ok(Self::from_parts(wire.resource, permits, clock, state))
    }
}

const WIRE_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireKey {
    v: u32,
    resource: String,
    /// A semaphore holder's permits (absent for a lock's key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    permits: Option<crate::permits::Permits>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remaining_ms: Option<u64>,
    #[serde(default)]
    tokens: BTreeMap<String, String>,
    /// The holder's metadata, base64 (absent without).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    meta: Option<String>,
}

/// The last 8 of a token's 32 bytes when this library made it: `xtr-wake`. A token ending in
/// its base64, [`ANNOUNCING_SUFFIX`], belongs to a holder that announces its release (see
/// `docs/waking.md`); the other 24 bytes (192 bits) are random. A peer's random token ends so
/// with probability 2⁻⁶⁴.
const TAG: &[u8; 8] = b"xtr-wake";

/// How the tokens of holders that announce their releases end: the base64 of the 8 bytes
/// `xtr-wake` in the last 12 of 44 characters (this library's tokens are 24 random bytes and
/// those 8; 24 bytes encode to exactly 32 characters, so the tag keeps its own characters).
/// Waiters behind holders whose tokens all end so need not poll (see `docs/waking.md`).
pub(crate) const ANNOUNCING_SUFFIX: &str = "eHRyLXdha2U=";

pub(super) fn new_token() -> String {
    let mut bytes = [0u8; 32];
    // getrandom only fails where the OS has no CSPRNG at all; no lock can be safe there.
    getrandom::fill(&mut bytes[..24]).expect("the operating system's random source failed");
    bytes[24..].copy_from_slice(TAG);
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod token_tests {
    use super::*;

    #[test]
    fn new_tokens_are_the_peers_format_and_end_in_the_tag() {
        let a = new_token();
        let b = new_token();
        assert_ne!(a, b);
        for t in [&a, &b] {
            validate_token(t).unwrap();
            assert!(t.ends_with(ANNOUNCING_SUFFIX), "{t}");
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(&a)
            .unwrap();
        assert_eq!(&decoded[24..], TAG);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_key_serialized_during_a_renewal_carries_the_confirmed_lifetime() {
        let k = Key::new("r");
        k.reduce_lifetime(Duration::from_secs(10));
        k.begin_renewal();
        k.reduce_lifetime(Duration::from_secs(600));
        let back = Key::from_json(&k.to_json().unwrap()).unwrap();
        let left = back.remaining_lifetime().unwrap();
        assert!(left <= Duration::from_secs(10), "{left:?}");
        k.end_renewal(true);
        let back = Key::from_json(&k.to_json().unwrap()).unwrap();
        assert!(back.remaining_lifetime().unwrap() > Duration::from_secs(590));

        // A shortening renewal may land unanswered: the sooner deadline counts at once.
        k.begin_renewal();
        k.reduce_lifetime(Duration::from_secs(5));
        let back = Key::from_json(&k.to_json().unwrap()).unwrap();
        assert!(back.remaining_lifetime().unwrap() <= Duration::from_secs(5));
        // ... and stays once it failed: whether it landed is not known.
        k.end_renewal(false);
        let back = Key::from_json(&k.to_json().unwrap()).unwrap();
        assert!(back.remaining_lifetime().unwrap() <= Duration::from_secs(5));

        // A failed lengthening renewal leaves the deadline from before.
        k.begin_renewal();
        k.reduce_lifetime(Duration::from_secs(900));
        k.end_renewal(false);
        let left = k.remaining_lifetime().unwrap();
        assert!(left <= Duration::from_secs(5), "{left:?}");
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
}
