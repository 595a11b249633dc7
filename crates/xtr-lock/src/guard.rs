//! [`LockGuard`], scoped use, and the background clean-ups that make drops safe.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt as _;

use crate::Lockable;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::lock::{Lock, TARGET};
use crate::store::Store;

/// Holds a write lock taken by [`Lock::lock`] and releases it when it goes.
///
/// - [`unlock`](LockGuard::unlock) releases now and reports errors: prefer it.
/// - Dropping the guard cannot wait (there is no async drop), so it **schedules** the release on
///   the current tokio runtime (or, outside any runtime, on a short-lived thread) and returns at
///   once. The release runs before any later store operation of the same holder, but another
///   holder may find the lock still taken for a moment; errors of a scheduled release are logged
///   at warn.
/// - A guard made while its holder already held the lock (nesting) leaves the lock held.
/// - [`keep`](LockGuard::keep) gives up the guard and leaves the lock held.
#[must_use = "dropping the guard releases the lock (in the background) at once"]
pub struct LockGuard {
    lock: Lock,
    took: bool,
    active: bool,
}

impl LockGuard {
    pub(crate) fn new(lock: Lock, took: bool) -> Self {
        LockGuard {
            lock,
            took,
            active: true,
        }
    }

    /// The lock this guard holds.
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// The fencing token of this acquisition, where the store gives one.
    pub fn fencing_token(&self) -> Option<u64> {
        self.lock.fencing_token()
    }

    /// Whether this guard took the lock (and so releases it), rather than nesting in a holder
    /// that already held it.
    pub fn took(&self) -> bool {
        self.took
    }

    /// Releases the lock now, if this guard took it and the store confirms the holder still
    /// holds it; a lock lost meanwhile is left alone.
    ///
    /// # Errors
    ///
    /// The release's error ([`ErrorKind::Releasing`](crate::ErrorKind::Releasing)), or the
    /// store's error asking whether the lock is still held.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, the release is scheduled as for a dropped guard.
    pub async fn unlock(mut self) -> Result<()> {
        let result = exit(&self.lock, self.took).await;
        self.active = false;
        result
    }

    /// Gives up the guard and leaves the lock held; returns the lock.
    pub fn keep(mut self) -> Lock {
        self.active = false;
        self.lock.clone()
    }

    /// Runs `body` under the guard, then releases as [`Lock::scoped`] does.
    ///
    /// # Errors
    ///
    /// The body's error, or the release's error converted into `E` after a successful body.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, the release is scheduled as for a dropped guard.
    pub async fn run<T, E, F>(mut self, body: F) -> std::result::Result<T, E>
    where
        F: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let out = run_scope(&self.lock, self.took, body).await;
        self.active = false;
        out
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.active && self.took {
            self.lock.release_in_background();
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock)
            .field("took", &self.took)
            .finish()
    }
}

/// The exit of a scope (SCOPE-2): release only if the scope took the lock, the holder is still
/// believed to hold it, and the store confirms.
async fn exit(lock: &(impl Lockable + ?Sized), took: bool) -> Result<()> {
    if !took || !lock.is_believed_held() {
        return Ok(());
    }
    if !lock.is_acquired().await? {
        return Ok(());
    }
    lock.release().await.map(|_| ())
}

/// Runs `body`; on the way out (result, error, panic or drop) releases as [`exit`] says.
pub(crate) async fn run_scope<L, T, E, F>(
    lock: &L,
    took: bool,
    body: F,
) -> std::result::Result<T, E>
where
    L: Lockable + ?Sized,
    F: Future<Output = std::result::Result<T, E>>,
    E: From<Error>,
{
    /// Schedules the release if the scope is dropped before its exit completes.
    struct OnDrop<'a, L: Lockable + ?Sized> {
        lock: &'a L,
        armed: bool,
    }
    impl<L: Lockable + ?Sized> Drop for OnDrop<'_, L> {
        fn drop(&mut self) {
            if self.armed {
                self.lock.release_in_background();
            }
        }
    }
    let mut on_drop = OnDrop { lock, armed: took };
    let out = AssertUnwindSafe(body).catch_unwind().await;
    let released = exit(lock, took).await;
    on_drop.armed = false;
    match (out, released) {
        (Err(panic), released) => {
            if let Err(err) = released {
                tracing::warn!(target: TARGET, resource = lock.resource(), error = %err,
                    "failed to release the lock after the scope panicked");
            }
            std::panic::resume_unwind(panic)
        }
        (Ok(Err(body_err)), Err(err)) => {
            // The body's error wins; the release failure is reported here.
            tracing::warn!(target: TARGET, resource = lock.resource(), error = %err,
                "failed to release the lock after the scope failed");
            Err(body_err)
        }
        (Ok(out), Ok(())) => out,
        (Ok(Ok(_)), Err(err)) => Err(E::from(err)),
    }
}

/// Releases on the way out of a dropped future: runs `store.delete(key)` to completion in the
/// background, ordered before the holder's next store operation. Skipped when another task of
/// the same holder completed an acquisition since `acquisitions` was read: that lock is theirs.
pub(crate) fn schedule_cleanup(
    key: Key,
    store: Arc<dyn Store>,
    acquisitions: u64,
    why: &'static str,
) {
    if key.acquisitions() != acquisitions {
        return;
    }
    key.mark_still_held(false);
    key.begin_cleanup();
    /// Ends the clean-up even if the task is dropped unrun (runtime shutting down), so the
    /// holder's later operations never wait for it forever.
    struct Done(Key);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.end_cleanup();
        }
    }
    let done = Done(key.clone());
    let task = async move {
        let _done = done;
        let _turn = key.cleanup_turn().await;
        if key.acquisitions() != acquisitions {
            return;
        }
        key.mark_still_held(false);
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
