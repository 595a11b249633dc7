//! Waking waiters on release: one shared subscriber connection per store, one channel per
//! waited-on lock key, and one waiter woken per release (no thundering herd).
//!
//! Releases by this library publish on `__xtr_lock__:released:<key>` from inside the release
//! script. Python and PHP peers never publish, and expiry is silent, so waiters keep a poll
//! (the watchers are best-effort) and sleep only until the earliest lease ends (the scripts
//! say when).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::Notify;

use super::lock;
use crate::store::Watcher;

/// The channel a release of `key` is announced on.
pub(super) fn channel(key: &str) -> String {
    format!("__xtr_lock__:released:{key}")
}

pub(super) struct Notifier {
    client: redis::Client,
    connect_timeout: Duration,
    inner: Arc<Mutex<State>>,
    /// Orders every connect, SUBSCRIBE and UNSUBSCRIBE, so an unsubscription never overtakes a
    /// later subscription of the same channel.
    ops: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    sink: Option<redis::aio::PubSubSink>,
    /// The task reading the subscriber connection (aborted by `close`).
    reader: Option<tokio::task::AbortHandle>,
    /// After a failed connect or subscribe: no new try before this instant, and the pause
    /// before the next one (doubling up to [`MAX_BACKOFF`]). Waiters poll meanwhile, so an
    /// unreachable or paused server costs one connect timeout per back-off, not one per wait.
    retry_at: Option<(tokio::time::Instant, Duration)>,
}

/// The first and the longest pause between two tries to (re)connect the subscriber.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

struct Channel {
    wake: Arc<Notify>,
    /// Waiters watching it now.
    waiters: usize,
    /// Whether the server has acknowledged the subscription on the current connection.
    subscribed: bool,
}

/// Channels nobody waits on stay subscribed (a waiter re-watches between attempts) until this
/// many pile up.
const IDLE_CHANNELS: usize = 64;

impl Notifier {
    pub(super) fn new(client: redis::Client, connect_timeout: Duration) -> Self {
        Notifier {
            client,
            connect_timeout,
            inner: Arc::default(),
            ops: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.inner)
    }

    /// A watcher on the next release of `key`, subscribed before this returns. `None` when the
    /// subscriber connection cannot be had (the waiter then polls).
    pub(super) async fn watch(&self, key: &str) -> Option<Watcher> {
        let name = channel(key);
        let (wake, ready, idle) = {
            let mut st = self.state();
            let connected = st.sink.is_some();
            let chan = st.channels.entry(name.clone()).or_insert_with(|| Channel {
                wake: Arc::default(),
                waiters: 0,
                subscribed: false,
            });
            chan.waiters += 1;
            let ready = chan.subscribed && connected;
            let wake = chan.wake.clone();
            let idle = st.channels.values().filter(|c| c.waiters == 0).count();
            (wake, ready, idle)
        };
        let guard = WaiterGuard {
            inner: self.inner.clone(),
            name: name.clone(),
        };
        if !ready || idle > IDLE_CHANNELS {
            if self.backing_off() {
                return None;
            }
            let _ops = self.ops.lock().await;
            if self.backing_off() {
                return None; // the try this one queued behind has just failed
            }
            if idle > IDLE_CHANNELS {
                self.sweep().await;
            }
            match self.subscribe(&name).await {
                Ok(()) => self.state().retry_at = None,
                Err(err) => {
                    let mut st = self.state();
                    let pause = st
                        .retry_at
                        .map_or(FIRST_BACKOFF, |(_, p)| (p * 2).min(MAX_BACKOFF));
                    st.retry_at = Some((tokio::time::Instant::now() + pause, pause));
                    tracing::debug!(target: "xtr_lock", error = %err, retry_in = ?pause,
                        "cannot subscribe to release notifications; polling instead");
                    return None;
                }
            }
        }
        Some(Watcher::best_effort(async move {
            let _guard = guard;
            wake.notified().await;
        }))
    }

    /// Whether a failed connect is too recent to try again.
    fn backing_off(&self) -> bool {
        self.state()
            .retry_at
            .is_some_and(|(at, _)| tokio::time::Instant::now() < at)
    }

    /// Passes the turn to one more waiter of `key` (a reader got in; others may join).
    pub(super) fn pass_turn(&self, key: &str) {
        if let Some(chan) = self.state().channels.get(&channel(key))
            && chan.waiters > 0
        {
            chan.wake.notify_one();
        }
    }

    /// Subscribes `name` unless it already is (called with `ops` held).
    async fn subscribe(&self, name: &str) -> redis::RedisResult<()> {
        let existing = {
            let st = self.state();
            if st.sink.is_some() && st.channels.get(name).is_some_and(|c| c.subscribed) {
                return Ok(());
            }
            st.sink.clone()
        };
        let mut sink = match existing {
            Some(sink) => sink,
            None => self.connect().await?,
        };
        let subscribed =
            match tokio::time::timeout(self.connect_timeout, sink.subscribe(name)).await {
                Ok(result) => result,
                Err(_) => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "subscribe timed out",
                ))),
            };
        if let Err(err) = subscribed {
            // The connection is no good (its reader may have died with another runtime): the
            // next waiter opens a new one.
            self.state().sink = None;
            return Err(err);
        }
        if let Some(chan) = self.state().channels.get_mut(name) {
            chan.subscribed = true;
        }
        Ok(())
    }

    /// Unsubscribes channels nobody waits on (called with `ops` held).
    async fn sweep(&self) {
        let (idle, sink): (Vec<String>, _) = {
            let mut st = self.state();
            let idle: Vec<String> = st
                .channels
                .iter()
                .filter(|(_, c)| c.waiters == 0)
                .map(|(n, _)| n.clone())
                .collect();
            for name in &idle {
                st.channels.remove(name);
            }
            (idle, st.sink.clone())
        };
        if let Some(mut sink) = sink {
            for name in idle {
                let _ = sink.unsubscribe(&name).await;
            }
        }
    }

    /// Opens the subscriber connection and starts its reader task (called with `ops` held).
    async fn connect(&self) -> redis::RedisResult<redis::aio::PubSubSink> {
        let pubsub = match tokio::time::timeout(
            self.connect_timeout,
            self.client.get_async_pubsub(),
        )
        .await
        {
            Ok(result) => result?,
            Err(_) => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "connecting the subscriber timed out",
                )));
            }
        };
        let (sink, mut stream) = pubsub.split();
        let inner = self.inner.clone();
        let reader = tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let wake = lock(&inner)
                    .channels
                    .get(msg.get_channel_name())
                    .map(|c| c.wake.clone());
                if let Some(wake) = wake {
                    wake.notify_one();
                }
            }
            // The connection is gone: wake everyone so they retry (and re-watch, reconnecting).
            disconnected(&mut lock(&inner));
        });
        let mut st = self.state();
        for chan in st.channels.values_mut() {
            chan.subscribed = false;
        }
        st.sink = Some(sink.clone());
        if let Some(old) = st.reader.replace(reader.abort_handle()) {
            old.abort();
        }
        Ok(sink)
    }

    /// Closes the subscriber connection: its reader stops (dropping the connection) and every
    /// waiter wakes to poll, re-subscribing on a new connection if it waits again.
    pub(super) fn close(&self) {
        let mut st = self.state();
        if let Some(reader) = st.reader.take() {
            reader.abort();
        }
        disconnected(&mut st);
    }
}

/// Forgets the subscriber connection and wakes every waiter, so they retry and re-watch.
fn disconnected(st: &mut State) {
    st.sink = None;
    for chan in st.channels.values_mut() {
        chan.subscribed = false;
        chan.wake.notify_waiters();
    }
}

/// Drops a waiter's interest (the channel stays subscribed until swept).
struct WaiterGuard {
    inner: Arc<Mutex<State>>,
    name: String,
}

impl Drop for WaiterGuard {
    fn drop(&mut self) {
        if let Some(chan) = lock(&self.inner).channels.get_mut(&self.name) {
            chan.waiters = chan.waiters.saturating_sub(1);
        }
    }
}
