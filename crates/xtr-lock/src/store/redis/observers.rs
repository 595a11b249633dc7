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

use super::layout::{SHARDED_WAKE, WAKE_CHANNEL};
use super::notify::{Notifier, State};
use super::{RedisStore, lock};

/// What follows the wake channel's head in an observer's channel, before the lock key.
const OBSERVED: &str = "obs:";

/// The channels observed on the current subscriber connection.
#[derive(Default)]
pub(super) struct Observed {
    /// By channel: told of each change (a count), and whether the server has confirmed the
    /// subscription (until then, an observer cannot count on it).
    channels: HashMap<Vec<u8>, (watch::Sender<u64>, bool)>,
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
}

impl Notifier {
    /// The channel on which the scripts announce changes of `lock_key`'s holders (see
    /// `queue.rs`'s `observed`).
    fn observer_channel(&self, store: &RedisStore, lock_key: &str) -> Vec<u8> {
        let mut channel = if self.sharded {
            let mut head = store
                .inner
                .layout
                .slot_head(super::layout::slot_of(lock_key.as_bytes()));
            head.extend_from_slice(SHARDED_WAKE);
            head
        } else {
            WAKE_CHANNEL.as_bytes().to_vec()
        };
        channel.extend_from_slice(OBSERVED.as_bytes());
        channel.extend_from_slice(lock_key.as_bytes());
        channel
    }
}

impl Notifier {
    /// A receiver that changes each time a script changes who holds `lock_key`. `None` while
    /// the subscription is being made by another observer, or when the subscriber connection
    /// cannot be had: the observer polls then.
    pub(super) async fn observe_changes(
        &self,
        store: &RedisStore,
        lock_key: &str,
    ) -> Option<watch::Receiver<u64>> {
        let channel = self.observer_channel(store, lock_key);
        let subscribing = if self.sharded {
            let slot = super::layout::slot_of(lock_key.as_bytes());
            // The slot's wake channel first: the subscriber connection, on the slot's node.
            if !self.ensure_shard(store, slot).await {
                return None;
            }
            let conn = self.state().shards.conn.clone()?;
            Subscribing::Shard(conn)
        } else {
            if !self.ensure_subscribed(store).await {
                return None;
            }
            Subscribing::One(self.state().sink.clone()?)
        };
        {
            let mut st = self.state();
            if let Some((tx, ready)) = st.observed.channels.get(&channel) {
                return ready.then(|| tx.subscribe());
            }
            // Registered before the subscription: no message can come before it.
            st.observed
                .channels
                .insert(channel.clone(), (watch::channel(0).0, false));
        }
        let subscribed = tokio::time::timeout(self.connect_timeout, async {
            match subscribing {
                Subscribing::One(mut sink) => sink.subscribe(channel.as_slice()).await,
                Subscribing::Shard(mut conn) => conn.ssubscribe(channel.as_slice()).await,
            }
        })
        .await;
        let mut st = self.state();
        match (subscribed, st.observed.channels.get_mut(&channel)) {
            (Ok(Ok(())), Some((tx, ready))) => {
                *ready = true;
                Some(tx.subscribe())
            }
            (_, Some(_)) => {
                st.observed.channels.remove(&channel);
                None
            }
            // The connection (or the slot) went meanwhile, and its channels with it.
            (_, None) => None,
        }
    }
}

/// The connection an observer's channel is subscribed on.
enum Subscribing {
    One(redis::aio::PubSubSink),
    Shard(redis::cluster_async::ClusterConnection),
}

/// A message on `channel` (from a subscriber's reader): `true` if it was an observer's (its
/// payload is empty; a wake's never is), whose receivers are told.
pub(super) fn announced(state: &std::sync::Mutex<State>, channel: &[u8], payload: &[u8]) -> bool {
    if !payload.is_empty() {
        return false;
    }
    if let Some((tx, _)) = lock(state).observed.channels.get(channel) {
        tx.send_modify(|n| *n = n.wrapping_add(1));
    }
    true
}
