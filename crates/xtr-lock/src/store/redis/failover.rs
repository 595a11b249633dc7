//! Sentinel fail-overs seen by holders: a store whose master is found through Sentinel listens
//! for the sentinels' `+switch-master` announcements (and finds the master again whenever the
//! old one stops answering as one); each holder's loss watcher then looks for its lock on the
//! new master and reports it lost at once if the promoted replica never had it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt as _;

use super::servers::Servers;
use super::{Inner, RedisStore, lock};
use crate::key::Key;
use crate::logging::TARGET;
use crate::store::{Holding, LossWatcher, Store as _};

/// The longest pause between two tries to reach a sentinel for its announcements.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How often the listener looks whether its store is still there.
const STORE_GONE_CHECK: Duration = Duration::from_secs(5);

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
        let servers = self.inner.servers.clone();
        runtime.spawn(async move {
            let mut pause = Duration::from_millis(100);
            // Holds the store weakly: the task ends soon after the store is dropped.
            while weak.strong_count() > 0 {
                if let Err(err) = follow_switches(&servers, &weak).await {
                    tracing::debug!(target: TARGET, error = %err,
                        "cannot listen to the sentinels' fail-over announcements");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_BACKOFF);
            }
        });
    }
}

/// Listens on one sentinel until its connection ends or the store is gone; each
/// `+switch-master` of our master drops the store's command connection and finds the new master
/// (which tells the holders' loss watchers).
async fn follow_switches(servers: &Servers, store: &Weak<Inner>) -> redis::RedisResult<()> {
    let Some(sentinel) = servers.sentinel() else {
        return Ok(());
    };
    let client = sentinel.sentinel_client().await?;
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe("+switch-master").await?;
    let mut messages = pubsub.on_message();
    let mut alive = tokio::time::interval(STORE_GONE_CHECK);
    loop {
        let msg = tokio::select! {
            msg = messages.next() => msg,
            _ = alive.tick() => {
                if store.strong_count() == 0 {
                    return Ok(());
                }
                continue;
            }
        };
        let Some(msg) = msg else {
            return Ok(());
        };
        let Ok(text) = msg.get_payload::<String>() else {
            continue;
        };
        // `<master name> <old ip> <old port> <new ip> <new port>`
        if text.split(' ').next() != Some(sentinel.master_name()) {
            continue;
        }
        let Some(inner) = store.upgrade() else {
            return Ok(());
        };
        tracing::info!(target: TARGET, store = %inner.shown, switch = %text,
            "Sentinel switched the master");
        lock(&inner.conn).take();
        drop(inner);
        sentinel.forget();
        if let Err(err) = sentinel.find_master().await {
            tracing::debug!(target: TARGET, error = %err, "cannot reach the new master yet");
        }
    }
}
