//! How an observer subscribes to its lock's channel (see `observers.rs`): on the store's
//! subscriber connection, or on a cluster the sharded one of the lock's slot.

use tokio::sync::watch;

use super::RedisStore;
use super::layout::{SHARDED_WAKE, WAKE_CHANNEL};
use super::notify::Notifier;
use super::observers::OBSERVED;

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
