//! Sentinel fail-overs seen by holders: a store whose master is found through Sentinel listens
//! for the sentinels' `+switch-master` announcements (and finds the master again whenever the
//! old one stops answering as one); each holder's loss watcher then looks for its lock on the
//! new master and reports it lost at once if the promoted replica never had it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt as _;

use super::{RedisStore, lock};
use crate::key::Key;
use crate::logging::TARGET;
use crate::store::{Holding, LossWatcher, Store as _};

/// The longest pause between two tries to reach a sentinel for its announcements.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl RedisStore {
    /// A loss watcher for `key`'s holder that looks again after each change of master; `None`
    /// when the store has no Sentinel.
    pub(super) fn failover_watcher(&self, key: &Key) -> Option<LossWatcher> {
        let sentinel = self.inner.servers.sentinel()?;
        self.listen_for_switches();
        let mut changes = sentinel.changes.subscribe();
        let (store, key) = (self.clone(), key.clone());
        Some(LossWatcher::new(async move {
            loop {
                if changes.changed().await.is_err() {
                    return std::future::pending().await;
                }
                match store.exists(&key).await {
                    Ok(Holding::NotHeld(reason)) => {
                        tracing::warn!(target: TARGET, resource = key.resource(), store = %store,
                            "the new master after a Sentinel fail-over does not have the lock");
                        return reason;
                    }
                    Ok(Holding::Held(_)) => {}
                    // The next renewal or check finds out.
                    Err(err) => tracing::debug!(target: TARGET, resource = key.resource(),
                        error = %err, "cannot look for the lock on the new master"),
                }
            }
        }))
    }

    /// Starts (once per store) the task that listens for `+switch-master` on a sentinel.
    fn listen_for_switches(&self) {
        let Some(sentinel) = self.inner.servers.sentinel() else {
            return;
        };
        if sentinel.listening.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            sentinel.listening.store(false, Ordering::SeqCst);
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let store = RedisStore { inner };
                let outcome = store.follow_switches().await;
                if let Err(err) = outcome {
                    tracing::debug!(target: TARGET, store = %store, error = %err,
                        "cannot listen to the sentinels' fail-over announcements");
                }
                drop(store);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_BACKOFF);
            }
        });
    }

    /// Listens on one sentinel until its connection ends; each `+switch-master` of our master
    /// drops the command connection and finds the new master.
    async fn follow_switches(&self) -> redis::RedisResult<()> {
        let Some(sentinel) = self.inner.servers.sentinel() else {
            return Ok(());
        };
        let client = sentinel.sentinel_client().await?;
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe("+switch-master").await?;
        let mut messages = pubsub.on_message();
        while let Some(msg) = messages.next().await {
            let Ok(text) = msg.get_payload::<String>() else {
                continue;
            };
            // `<master name> <old ip> <old port> <new ip> <new port>`
            if text.split(' ').next() != Some(sentinel.master_name()) {
                continue;
            }
            tracing::info!(target: TARGET, store = %self, switch = %text, "Sentinel switched the master");
            lock(&self.inner.conn).take();
            sentinel.forget();
            if let Err(err) = sentinel.find_master().await {
                tracing::debug!(target: TARGET, error = %err, "cannot reach the new master yet");
            }
        }
        Ok(())
    }
}
