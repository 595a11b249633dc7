//! Holder metadata: the small value a holder carries ([`Key::set_meta`](crate::Key::set_meta)),
//! and [`HolderRecord`], what a store keeps about one holder beside its lock (in its own
//! namespace, where peers neither read nor break it).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The largest holder metadata, in bytes. Stores keep it beside every lock, and `list` shows
/// it for every holder: it names a holder, it is not a payload.
pub const MAX_META: usize = 1024;

/// Checks a holder's metadata: at most [`MAX_META`] bytes.
///
/// # Errors
///
/// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) naming the size and the cap.
pub(crate) fn check_meta(meta: &[u8]) -> Result<()> {
    if meta.len() > MAX_META {
        return Err(Error::invalid_argument(format!(
            "holder metadata is {} bytes, at most {MAX_META} are kept",
            meta.len()
        )));
    }
    Ok(())
}

/// What a store keeps about one holder beside its lock: its metadata, when it acquired, and the
/// fencing token of that acquisition where the store fences.
///
/// Stores that keep it as text use [`encode`](HolderRecord::encode) (a line of JSON,
/// `{"v":1,"at_ms":…,"meta":"<base64>","fence":…}`), so every store of this library reads every
/// other's, and a record of a later version is read for what it shares.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderRecord {
    /// The holder's metadata, if it carried any.
    pub meta: Option<Vec<u8>>,
    /// When the holder acquired (its first save; a re-save keeps it).
    pub acquired_at: SystemTime,
    /// The fencing token of the acquisition, where the store fences.
    pub fencing_token: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct Wire {
    v: u32,
    at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    meta: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fence: Option<u64>,
}

impl HolderRecord {
    /// A record of an acquisition at `acquired_at` by a holder carrying `meta`.
    pub fn new(meta: Option<Vec<u8>>, acquired_at: SystemTime) -> Self {
        HolderRecord {
            meta,
            acquired_at,
            fencing_token: None,
        }
    }

    /// The same record with the acquisition's fencing token.
    pub fn with_fencing_token(mut self, token: Option<u64>) -> Self {
        self.fencing_token = token;
        self
    }

    /// The record of `key`'s holder acquiring now, on this machine's clock.
    pub fn now(key: &crate::Key) -> Self {
        Self::new(key.meta().map(|m| m.to_vec()), SystemTime::now())
    }

    /// The acquisition time in milliseconds since the Unix epoch (0 before it).
    pub fn acquired_at_ms(&self) -> u64 {
        let since = self
            .acquired_at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    }

    /// The record as one line of JSON.
    pub fn encode(&self) -> String {
        let wire = Wire {
            v: 1,
            at_ms: self.acquired_at_ms(),
            meta: self
                .meta
                .as_ref()
                .map(|m| base64::engine::general_purpose::STANDARD.encode(m)),
            fence: self.fencing_token,
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// A record written by [`encode`](HolderRecord::encode); `None` for anything else (a value
    /// nobody of ours wrote is shown as no record, never as an error).
    pub fn decode(text: &[u8]) -> Option<Self> {
        let wire: Wire = serde_json::from_slice(text).ok()?;
        let meta = match wire.meta {
            Some(m) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(m)
                    .ok()
                    .filter(|m| m.len() <= MAX_META)?,
            ),
            None => None,
        };
        Some(HolderRecord {
            meta,
            acquired_at: UNIX_EPOCH + Duration::from_millis(wire.at_ms),
            fencing_token: wire.fence,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_strangers_read_as_none() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let r = HolderRecord::new(Some(b"host=a\0\xff".to_vec()), at).with_fencing_token(Some(7));
        assert_eq!(HolderRecord::decode(r.encode().as_bytes()), Some(r));
        let bare = HolderRecord::new(None, at);
        assert_eq!(
            bare.encode(),
            r#"{"v":1,"at_ms":1700000000123}"#,
            "the documented form"
        );
        assert_eq!(HolderRecord::decode(bare.encode().as_bytes()), Some(bare));
        assert_eq!(HolderRecord::decode(b""), None);
        assert_eq!(HolderRecord::decode(b"read"), None);
        assert_eq!(
            HolderRecord::decode(br#"{"v":1,"at_ms":1,"meta":"!!"}"#),
            None
        );
        let later = br#"{"v":2,"at_ms":5,"new":true}"#;
        assert_eq!(
            HolderRecord::decode(later).map(|r| r.acquired_at_ms()),
            Some(5),
            "a later version is read for what it shares"
        );
    }

    #[test]
    fn metadata_is_capped() {
        assert!(check_meta(&[b'x'; MAX_META]).is_ok());
        let err = check_meta(&[b'x'; MAX_META + 1]).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("1025 bytes"), "{err}");
    }
}
