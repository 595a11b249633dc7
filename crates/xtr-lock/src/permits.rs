//! [`Permits`]: what a semaphore's holder asks for, carried by its [`Key`](crate::Key), and the
//! rules every counting store applies the same way.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A semaphore holder's request: `count` permits of a semaphore that lets `limit` permits be
/// held at once (Symfony Semaphore's weight and limit).
///
/// A key with permits ([`Key::for_semaphore`](crate::Key::for_semaphore)) is one holder, as a
/// lock's key is: every rule of locks (ttl, renewal, loss, cancellation, fencing where the store
/// has it) holds per holder, and its `count` permits are taken and given back together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawPermits")]
pub struct Permits {
    limit: u32,
    count: u32,
}

/// The wire form, checked into [`Permits`] on the way in.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPermits {
    limit: u32,
    count: u32,
}

impl TryFrom<RawPermits> for Permits {
    type Error = Error;
    fn try_from(raw: RawPermits) -> Result<Self> {
        Permits::new(raw.limit, raw.count)
    }
}

/// The largest limit a semaphore may have. Stores that keep one slot per permit (flock's slot
/// files, Memcached's keys) try up to this many.
pub const MAX_PERMITS: u32 = 1000;

impl Permits {
    /// `count` permits of a semaphore of `limit`.
    ///
    /// # Errors
    ///
    /// [`InvalidArgument`](crate::ErrorKind::InvalidArgument) unless
    /// `1 <= count <= limit <= 1000`.
    pub fn new(limit: u32, count: u32) -> Result<Self> {
        if limit == 0 || limit > MAX_PERMITS {
            return Err(Error::invalid_argument(format!(
                "a semaphore's limit must be between 1 and {MAX_PERMITS}, got {limit}"
            )));
        }
        if count == 0 || count > limit {
            return Err(Error::invalid_argument(format!(
                "a holder takes between 1 and the limit ({limit}) permits, got {count}"
            )));
        }
        Ok(Permits { limit, count })
    }

    /// How many permits may be held at once.
    pub fn limit(self) -> u32 {
        self.limit
    }

    /// How many permits this holder takes.
    pub fn count(self) -> u32 {
        self.count
    }

    /// The error for a holder that holds `held` permits and asks again for this count (a key
    /// edited on its travels): refused, so that no holder believes it holds more than the
    /// store counts.
    pub fn count_changed(self, resource: &str, held: u32) -> Error {
        Error::invalid_argument(format!(
            "this holder holds {held} permits and asks for {}: a holder's count never changes",
            self.count
        ))
        .with_resource(resource)
    }

    /// The error for a store whose semaphore was set up with `stored` permits by its current
    /// holders, when this holder asks for another limit. The stored limit binds while anybody
    /// holds; a semaphore nobody holds takes the next holder's.
    pub fn limit_mismatch(self, resource: &str, stored: u32) -> Error {
        Error::invalid_argument(format!(
            "the semaphore's holders use a limit of {stored}; this holder asks for a limit of {} \
             (every holder must use one limit; it may change once nobody holds)",
            self.limit
        ))
        .with_resource(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        assert!(Permits::new(0, 1).is_err());
        assert!(Permits::new(3, 0).is_err());
        assert!(Permits::new(3, 4).is_err());
        assert!(Permits::new(MAX_PERMITS + 1, 1).is_err());
        let p = Permits::new(3, 2).unwrap();
        assert_eq!((p.limit(), p.count()), (3, 2));
        let e = p.limit_mismatch("r", 4).to_string();
        assert!(e.contains("limit of 4") && e.contains("limit of 3"), "{e}");
    }

    #[test]
    fn deserializing_checks_the_bounds() {
        let ok: Permits = serde_json::from_str(r#"{"limit":3,"count":2}"#).unwrap();
        assert_eq!(ok, Permits::new(3, 2).unwrap());
        for bad in [
            r#"{"limit":0,"count":7}"#,
            r#"{"limit":4294967295,"count":1}"#,
        ] {
            let e = serde_json::from_str::<Permits>(bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("limit"), "{e}");
        }
    }
}
