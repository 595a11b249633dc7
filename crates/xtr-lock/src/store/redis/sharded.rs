//! Wakes on a Redis Cluster: a script may publish only on a sharded channel of its keys' slot
//! (`SPUBLISH`), so a store's waiters listen on one sharded channel per slot they wait in
//! (`<slot head>wake:<store id>`, see `layout.rs`), subscribed on first use on the node that
//! serves the slot (`SSUBSCRIBE`, Redis 7). A release wakes the one waiter it chose, on one
//! node: no herd across nodes. When a slot moves (resharding, fail-over) the server ends the
//! subscription; its waiters are woken to look again, and the next wait subscribes on the
//! slot's new node.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::FutureExt as _;
use redis::cluster_async::ClusterConnection;
use redis::{PushKind, Value};

use super::layout::SHARDED_WAKE;
use super::notify::{Notifier, State, on_wake};
use super::{Inner, RedisStore, lock};
use crate::clock::BoxFuture;
use crate::logging::TARGET;

/// The first and the longest pause between two tries to subscribe after a failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Notifier {
    /// Makes sure the wake channel of `slot` is subscribed.
    pub(super) async fn ensure_shard(&self, store: &RedisStore, slot: u16) -> bool {
        let attempt = {
            let mut st = self.state();
            let shards = &mut st.shards;
            if shards.live.contains(&slot) {
                return true;
            }
            if shards
                .retry_at
                .is_some_and(|(at, _)| tokio::time::Instant::now() < at)
            {
                return false;
            }
            match shards.pending.get(&slot) {
                // (One that ended without clearing its slot died with its runtime.)
                Some(under_way) if under_way.peek().is_none() => under_way.clone(),
                _ => {
                    let store = store.clone();
                    let task = tokio::spawn(async move {
                        store.inner.notifier.subscribe_shard(&store, slot).await
                    });
                    let under_way: BoxFuture<'static, bool> =
                        Box::pin(async move { task.await.unwrap_or(false) });
                    let under_way = under_way.shared();
                    shards.pending.insert(slot, under_way.clone());
                    under_way
                }
            }
        };
        attempt.await
    }

    /// The sharded wake channel of `slot`.
    fn shard_channel(&self, store: &RedisStore, slot: u16) -> Vec<u8> {
        let mut channel = store.inner.layout.slot_head(slot);
        channel.extend_from_slice(SHARDED_WAKE);
        channel.extend_from_slice(self.id.as_bytes());
        channel
    }

    async fn subscribe_shard(&self, store: &RedisStore, slot: u16) -> bool {
        let outcome = async {
            let (mut conn, generation) = self.shard_conn(store).await?;
            let channel = self.shard_channel(store, slot);
            let subscribed =
                match tokio::time::timeout(self.connect_timeout, conn.ssubscribe(channel)).await {
                    Ok(result) => result,
                    Err(_) => Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "ssubscribe timed out",
                    ))),
                };
            subscribed
                .map(|()| generation)
                .map_err(|e| (e, Some(generation)))
        }
        .await;
        let mut st = self.state();
        st.shards.pending.remove(&slot);
        match outcome {
            // Live only on the connection that is still the subscriber: one replaced meanwhile
            // took its subscriptions with it (the next wait subscribes again).
            Ok(generation) if generation == st.shards.generation => {
                st.shards.retry_at = None;
                st.shards.live.insert(slot);
                true
            }
            Ok(_) => false,
            Err((err, generation)) => {
                let shards = &mut st.shards;
                let pause = shards
                    .retry_at
                    .map_or(FIRST_BACKOFF, |(_, p)| (p * 2).min(MAX_BACKOFF));
                shards.retry_at = Some((tokio::time::Instant::now() + pause, pause));
                tracing::debug!(target: TARGET, error = %err, slot, retry_in = ?pause,
                    "cannot subscribe to a slot's wake channel; its waiters poll instead");
                if generation.is_some_and(|g| g == shards.generation) {
                    // The connection may be dead: the next wait opens another, and the waiters
                    // of every slot it served look again.
                    shards.close();
                    st.wake_slot_all();
                }
                false
            }
        }
    }

    /// The subscriber connection and its generation, opened if there is none: one opening at a
    /// time (two first waits on different slots must not each open one and drop the other's).
    async fn shard_conn(
        &self,
        store: &RedisStore,
    ) -> Result<(ClusterConnection, u64), (redis::RedisError, Option<u64>)> {
        let gate = self.state().shards.gate.clone();
        let _one_at_a_time = gate.lock().await;
        let existing = {
            let st = self.state();
            st.shards.conn.clone().map(|c| (c, st.shards.generation))
        };
        match existing {
            Some(found) => Ok(found),
            None => self.connect_shards(store).await.map_err(|e| (e, None)),
        }
    }

    /// Opens the subscriber connection (RESP3, pushes to a reader task).
    async fn connect_shards(
        &self,
        store: &RedisStore,
    ) -> redis::RedisResult<(ClusterConnection, u64)> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let client = self
            .servers
            .cluster_subscriber(Some(self.connect_timeout), tx)
            .unwrap_or_else(|| {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "not a cluster",
                )))
            })?;
        let conn =
            match tokio::time::timeout(self.connect_timeout, client.get_async_connection()).await {
                Ok(result) => result?,
                Err(_) => {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "connecting the subscriber timed out",
                    )));
                }
            };
        let state = self.inner.clone();
        let weak = Arc::downgrade(&store.inner);
        let reader = tokio::spawn(async move {
            while let Some(push) = rx.recv().await {
                on_push(&state, &weak, push);
            }
        });
        let mut st = self.state();
        st.shards.close();
        st.shards.generation += 1;
        st.shards.conn = Some(conn.clone());
        st.shards.reader = Some(reader.abort_handle());
        let generation = st.shards.generation;
        Ok((conn, generation))
    }
}

/// One push of the subscriber connection: a wake, a slot's subscription ended by the server
/// (the slot moved), or the connection lost (redis-rs subscribes again; wakes sent meanwhile
/// are lost, so every waiter looks again).
fn on_push(state: &Arc<Mutex<State>>, store: &Weak<Inner>, push: redis::PushInfo) {
    match push.kind {
        PushKind::SMessage => {
            if let (Some(Value::BulkString(channel)), Some(Value::BulkString(payload))) =
                (push.data.first(), push.data.get(1))
                && payload.is_empty()
                && lock(state).observed.announce(channel, payload)
            {
                return;
            }
            if let Some(Value::BulkString(payload)) = push.data.get(1)
                && let Ok(payload) = std::str::from_utf8(payload)
            {
                on_wake(state, store, payload);
            }
        }
        PushKind::SUnsubscribe => {
            if let Some(Value::BulkString(channel)) = push.data.first() {
                let slot = super::layout::slot_of(channel);
                let mut st = lock(state);
                st.shards.live.remove(&slot);
                st.observed.drop_slot(slot);
                st.wake_slot(slot);
            }
        }
        PushKind::Disconnection => {
            let mut st = lock(state);
            st.shards.live.clear();
            st.observed.clear();
            st.wake_slot_all();
        }
        _ => {}
    }
}

impl State {
    /// Wakes every waiter on a lock in `slot`, so it looks again (and subscribes again).
    fn wake_slot(&mut self, slot: u16) {
        self.wake_where(|lock_key| super::layout::slot_of(lock_key.as_bytes()) == slot);
    }

    pub(super) fn wake_slot_all(&mut self) {
        self.wake_where(|_| true);
    }
}

// The waiters' fields are the notifier's; this is the one place outside it that wakes them.
impl State {
    fn wake_where(&mut self, which: impl Fn(&str) -> bool) {
        self.for_each_waiter(|lock_key, announced, wake| {
            if which(lock_key) {
                announced.store(false, Ordering::Relaxed);
                wake.notify_one();
            }
        });
    }
}
