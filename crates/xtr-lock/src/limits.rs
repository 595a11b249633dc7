//! Bounds on what callers may ask for.

use std::time::Duration;

/// The longest lifetime (ttl) and the longest wait this crate accepts: 3650 days. Longer ones are
/// refused ([`ErrorKind::InvalidTtl`](crate::ErrorKind::InvalidTtl), or an invalid argument for a
/// wait) before anything is stored, so that every deadline fits every clock and every store (a
/// Redis score and its `PEXPIREAT`, a monotonic `Instant`). A lock that must outlive this is a
/// lock without a ttl, on a store that holds one.
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 24 * 3600);

/// A DSN option's seconds (`2`, `0.5`): positive, finite and at most `max`, or `None`.
#[cfg_attr(
    not(any(feature = "redis", feature = "etcd", feature = "memcached")),
    allow(dead_code)
)]
pub(crate) fn positive_seconds(value: &str, max: Duration) -> Option<Duration> {
    match value.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= max.as_secs_f64() => {
            Some(Duration::from_secs_f64(s))
        }
        _ => None,
    }
}

/// The largest holder metadata, in bytes. Stores keep it beside every lock, and `list` shows
/// it for every holder: it names a holder, it is not a payload.
pub const MAX_META: usize = 1024;
