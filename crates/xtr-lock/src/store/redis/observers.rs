//! Observers told of changes: the scripts that change who holds a lock (an admission, a
//! release, a demotion, a shortened lease) publish on the lock's observer channel
//! (`queue.rs`'s `observed`): `<wake head>obs:<lock key>` on one server or a Sentinel's master
//! (`PUBLISH`), `<slot head>wake:obs:<lock key>` in the lock's slot on a cluster (`SPUBLISH`).
//! An observer (`watch_changes`) subscribes to it on the store's subscriber connection, beside
//! the wake channels. Nobody queues and nothing is written for it.
//!
//! A channel stays subscribed for the connection's life once observed (an election or a
//! `leader --watch` observes one resource for long); the subscriptions go with the connection
//! (or, on a cluster, with a slot that moves), and their observers then look again (their
//! receivers close) and subscribe anew.

use std::collections::HashMap;

use tokio::sync::watch;

/// What follows the wake channel's head in an observer's channel, before the lock key.
pub(super) const OBSERVED: &str = "obs:";

/// The channels observed on the current subscriber connection.
#[derive(Default)]
pub(super) struct Observed {
    /// By channel: told of each change (a count), and whether the server has confirmed the
    /// subscription (until then, an observer cannot count on it).
    pub(super) channels: HashMap<Vec<u8>, (watch::Sender<u64>, bool)>,
}

impl Observed {
    /// The connection is gone: its subscriptions with it; every observer looks again.
    pub(super) fn clear(&mut self) {
        self.channels.clear();
    }

    /// A cluster's `slot` moved: its channels' subscriptions ended; their observers look again.
    pub(super) fn drop_slot(&mut self, slot: u16) {
        self.channels
            .retain(|channel, _| super::layout::slot_of(channel) != slot);
    }

    /// A message on `channel` (from a subscriber's reader): `true` if it was an observer's (its
    /// payload is empty; a wake's never is), whose receivers are told.
    pub(super) fn announce(&self, channel: &[u8], payload: &[u8]) -> bool {
        if !payload.is_empty() {
            return false;
        }
        if let Some((tx, _)) = self.channels.get(channel) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        true
    }
}
