//! Background clean-ups: what a dropped future or guard leaves to take back runs to completion on
//! the runtime, ordered before the holder's next store operation.

use std::sync::Arc;

use crate::key::Key;
use crate::logging::TARGET;
use crate::store::Store;

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
    /// Ends the clean-up even if the task is dropped unrun (runtime shutting down), so the
    /// holder's later operations never wait for it forever.
    struct Done(Key);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.holder().end_cleanup();
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
            Ok(_) => tracing::debug!(target: TARGET, resource = key.resource(), why,
                "took the lock back in the background"),
            Err(err) => tracing::warn!(target: TARGET, resource = key.resource(), why,
                error = %err, "failed to take the lock back in the background"),
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
