//! What the store keeps on a holder's key.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

use crate::mutex::lock;
use crate::store::held::Claim;

/// What the store keeps on a holder's key: what its last refusal found.
#[derive(Default)]
pub(super) struct HolderState {
    /// The holder met at the last refusal announces its release to this store's waiters.
    pub(super) announced: Arc<AtomicBool>,
    /// ... through PostgreSQL's notifications (so only while the listener is up).
    pub(super) via_listener: Arc<AtomicBool>,
    /// The holder's token was made by a save here that never had a connection to send it
    /// on (the server unreachable, the caller gone): its release has nothing to delete.
    pub(super) unsent: Arc<AtomicBool>,
    /// Its entry among the store's holders, gone with the key.
    pub(super) claim: Mutex<Option<Claim>>,
    /// The metadata of the record last written for it (`None`: none written yet).
    pub(super) written: Mutex<Option<Option<Arc<[u8]>>>>,
    /// Until when its row is certainly unexpired: the send time of the last save or renewal
    /// the database confirmed, plus the ttl less the 1 s the row may be taken early.
    pub(super) live_until: Mutex<Option<std::time::Instant>>,
    /// While it waits in the fair queue: when its wait began (µs since the epoch).
    pub(super) waiting: Mutex<Option<i64>>,
    /// Its live watchers (each holds its place in the queue; see `queue::Place`).
    pub(super) watchers: AtomicUsize,
}

impl HolderState {
    /// Records that the row lasts at least until `until`.
    pub(super) fn confirm(&self, until: std::time::Instant) {
        *lock(&self.live_until) = Some(until);
    }

    /// Whether a re-save must write the record again: none written yet, or another metadata.
    pub(super) fn written(&self, meta: &Option<Arc<[u8]>>) -> bool {
        lock(&self.written).as_ref() != Some(meta)
    }

    /// Records that the record with `meta` was written.
    pub(super) fn wrote(&self, meta: Option<Arc<[u8]>>) {
        *lock(&self.written) = Some(meta);
    }

    /// Whether the row was certainly unexpired at `at`, so that nobody else can have taken it.
    pub(super) fn live_at(&self, at: std::time::Instant) -> bool {
        lock(&self.live_until).is_some_and(|until| at < until)
    }
}
