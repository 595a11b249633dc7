//! Background clean-ups: what a dropped future or guard leaves to take back runs to completion on
//! the runtime, ordered before the holder's next store operation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::key::Key;
use crate::logging::TARGET;
use crate::store::Store;

/// Clean-ups scheduled in this process and not finished.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// Woken when the last pending clean-up finishes.
static SETTLED: Notify = Notify::const_new();

/// Waits (at most `within`) until no clean-up scheduled in this process is still running: what
/// a runtime about to shut down does, so that its background releases are not dropped unrun.
pub(crate) async fn settled(within: Duration) {
    let _ = tokio::time::timeout(within, async {
        loop {
            let woken = SETTLED.notified();
            let mut woken = std::pin::pin!(woken);
            // Registered before the check, so a finish between the two is not missed.
            woken.as_mut().enable();
            if PENDING.load(Ordering::SeqCst) == 0 {
                return;
            }
            woken.await;
        }
    })
    .await;
}

/// Releases what `key` holds, in the background: runs `store.delete(key)` to completion,
/// ordered before the holder's next store operation. Skipped when the holder started a new
/// generation since `generation` was read (a sibling task of the same holder acquired anew: that
/// lock is the sibling's).
pub(crate) fn schedule_cleanup(
    key: Key,
    store: Arc<dyn Store>,
    generation: u64,
    why: &'static str,
) {
    let holder = key.holder();
    if holder.generation() != generation {
        return;
    }
    holder.released();
    holder.begin_cleanup();
    PENDING.fetch_add(1, Ordering::SeqCst);
    /// Ends the clean-up even if the task is dropped unrun (runtime shutting down), so the
    /// holder's later operations never wait for it forever.
    struct Done(Key);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.holder().end_cleanup();
            if PENDING.fetch_sub(1, Ordering::SeqCst) == 1 {
                SETTLED.notify_waiters();
            }
        }
    }
    let done = Done(key.clone());
    let task = async move {
        let _done = done;
        let holder = key.holder();
        let _turn = holder.cleanup_turn().await;
        if holder.generation() != generation {
            return;
        }
        holder.released();
        match store.delete(&key).await {
            Ok(_) => {
                tracing::debug!(target: TARGET, resource = key.resource(), store = %store, why,
                "took the lock back in the background")
            }
            Err(err) => {
                tracing::warn!(target: TARGET, resource = key.resource(), store = %store, why,
                error = %err, "failed to take the lock back in the background")
            }
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(task);
        }
        Err(_) => {
            // Dropped outside any runtime: a one-off thread runs the delete.
            let spawned = std::thread::Builder::new()
                .name("xtr-lock-cleanup".into())
                .spawn(move || {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt.block_on(task),
                        Err(err) => tracing::warn!(target: TARGET, error = %err,
                            "cannot start a runtime to take a lock back"),
                    }
                });
            if let Err(err) = spawned {
                tracing::warn!(target: TARGET, error = %err,
                    "cannot start a thread to take a lock back");
            }
        }
    }
}
