//! Bounds on what callers may ask for.

use std::time::Duration;

/// The longest lifetime (ttl) and the longest wait this crate accepts: 3650 days. Longer ones are
/// refused ([`ErrorKind::InvalidTtl`](crate::ErrorKind::InvalidTtl), or an invalid argument for a
/// wait) before anything is stored, so that every deadline fits every clock and every store (a
/// Redis score and its `PEXPIREAT`, a monotonic `Instant`). A lock that must outlive this is a
/// lock without a ttl, on a store that holds one.
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 24 * 3600);
