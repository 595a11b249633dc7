//! Observers told of changes on one server (or a Sentinel's master): the scripts that change
//! who holds a lock (an admission, a release, a demotion, a shortened lease) publish on
//! `<wake head>obs:<lock key>` (`queue.rs`'s `observed`), and an observer (`watch_changes`)
//! subscribes to it on the store's subscriber connection, beside the wake channel. Nobody
//! queues and nothing is written for it. A cluster's observers poll (`listing.rs`).
//!
//! A channel stays subscribed for the connection's life once observed (an election or a
//! `leader --watch` observes one resource for long); the subscriptions go with the connection,
//! and its observers then look again (their receivers close).

use std::collections::HashMap;

use tokio::sync::watch;

use super::layout::WAKE_CHANNEL;
use super::notify::{Notifier, State};
use super::{RedisStore, lock};

/// What follows the wake channel's head in an observer's channel, before the lock key.
const OBSERVED: &str = "obs:";

/// The channels observed on the current subscriber connection.
#[derive(Default)]
pub(super) struct Observed {
    /// By channel: told of each change (a count), and whether the server has confirmed the
    /// subscription (until then, an observer cannot count on it).
    channels: HashMap<String, (watch::Sender<u64>, bool)>,
}

impl Observed {
    /// The connection is gone: its subscriptions with it; every observer looks again.
    pub(super) fn clear(&mut self) {
        self.channels.clear();
    }
}

/// The channel on which the scripts announce changes of `lock_key`'s holders.
fn channel_of(lock_key: &str) -> String {
    format!("{WAKE_CHANNEL}{OBSERVED}{lock_key}")
}

impl Notifier {
    /// A receiver that changes each time a script changes who holds `lock_key`. `None` on a
    /// cluster, while the subscription is being made by another observer, or when the
    /// subscriber connection cannot be had: the observer polls then.
    pub(super) async fn observe_changes(
        &self,
        store: &RedisStore,
        lock_key: &str,
    ) -> Option<watch::Receiver<u64>> {
        if self.sharded || !self.ensure_subscribed(store).await {
            return None;
        }
        let channel = channel_of(lock_key);
        let sink = {
            let mut st = self.state();
            if let Some((tx, ready)) = st.observed.channels.get(&channel) {
                return ready.then(|| tx.subscribe());
            }
            let sink = st.sink.clone()?;
            // Registered before the subscription: no message can come before it.
            st.observed
                .channels
                .insert(channel.clone(), (watch::channel(0).0, false));
            sink
        };
        let mut sink = sink;
        let subscribed = tokio::time::timeout(self.connect_timeout, sink.subscribe(&channel)).await;
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
            // The connection went meanwhile (and its channels with it).
            (_, None) => None,
        }
    }
}

/// A message on `channel` (from the subscriber's reader): `true` if it was an observer's, whose
/// receivers are told.
pub(super) fn announced(state: &std::sync::Mutex<State>, channel: &str) -> bool {
    let Some(rest) = channel.strip_prefix(WAKE_CHANNEL) else {
        return false;
    };
    if !rest.starts_with(OBSERVED) {
        return false;
    }
    if let Some((tx, _)) = lock(state).observed.channels.get(channel) {
        tx.send_modify(|n| *n = n.wrapping_add(1));
    }
    true
}
