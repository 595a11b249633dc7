//! Waking waiters: in-process for releases by this store's own holders, and on PostgreSQL from
//! `LISTEN` on one connection per store for releases by this library's holders anywhere.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::watch;

use crate::mutex::lock;
use crate::store::channels::Channels;

/// Waiters of one store, by `key_id`.
#[derive(Default)]
pub(crate) struct Wakers {
    channels: Mutex<Channels>,
    /// The PostgreSQL listener is connected and listening: every notification reaches us.
    listening: AtomicBool,
    /// Flips on every change of `listening` (a waiter wants to know once it is up).
    state: Mutex<Option<watch::Sender<bool>>>,
}

impl Wakers {
    fn channels(&self) -> std::sync::MutexGuard<'_, Channels> {
        lock(&self.channels)
    }

    /// A receiver that changes on the next release of `id`.
    pub(crate) fn subscribe(&self, id: &str) -> watch::Receiver<u64> {
        self.channels().subscribe(id)
    }

    /// Wakes the waiters of `id`.
    pub(crate) fn notify(&self, id: &str) {
        self.channels().notify(id);
    }

    /// Whether releases notified through PostgreSQL reach us now.
    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    fn set_listening(&self, up: bool) {
        self.listening.store(up, Ordering::Release);
        if let Some(tx) = lock(&self.state).as_ref() {
            tx.send_replace(up);
        }
        if !up {
            // Notifications may have been missed while down: every waiter tries again (and
            // polls until the listener is back).
            self.channels().notify_all();
        }
    }

    /// Waits until the listener is up, at most `bound`.
    pub(crate) async fn until_listening(&self, bound: Duration) {
        let mut rx = {
            let mut state = lock(&self.state);
            state
                .get_or_insert_with(|| watch::channel(self.listening()).0)
                .subscribe()
        };
        let _ = tokio::time::timeout(bound, rx.wait_for(|up| *up)).await;
    }
}

/// Runs the listener of one store until aborted: `LISTEN channel`, each payload (a `key_id`)
/// wakes that resource's waiters; after a lost connection, every waiter is woken and the
/// listener reconnects (backing off up to 1 s).
pub(crate) async fn listen(pool: PgPool, channel: String, wakers: Arc<Wakers>) {
    let mut pause = Duration::from_millis(20);
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        }
        .await;
        let mut listener = match connected {
            Ok(l) => l,
            Err(err) => {
                tracing::debug!(target: crate::logging::TARGET, error = %err,
                    "cannot listen for releases; waiters poll meanwhile");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        wakers.set_listening(true);
        pause = Duration::from_millis(20);
        while let Ok(Some(n)) = listener.try_recv().await {
            wakers.notify(n.payload());
        }
        wakers.set_listening(false);
    }
}
