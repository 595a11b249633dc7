//! Revocation: asking every holder of a resource to give it up.
//!
//! A revocation is a notice: a lock its revoker holds on the sibling resource
//! `"{resource}#xtr-revoke"` (shared where the store has shared locks, so that revokers do not
//! wait for each other) until the resource's holders have let go, or its wait ends. The monitor
//! of every holder of this library (guards, scopes, [`keep_alive`](crate::Lockable::keep_alive),
//! `xtr-lock run`) looks for a notice on its resource: at each renewal where locks expire, else
//! once a second, and at once where the store tells of the change (etcd's watch, the in-memory
//! store, flock's file events where the notice's file is new); a notice found is a loss with
//! [`LostReason::Revoked`](crate::LostReason::Revoked). Holders of other libraries (Python,
//! PHP) do not look: they cannot be asked, and a revocation then waits for them in vain.
//!
//! Built from the store's own locks and [`holders`](crate::store::Store::holders), so every
//! store that can tell who holds a resource supports it alike, with nothing stored that
//! outlives the revoker's wait.

use std::time::Duration;

use tokio::task::AbortHandle;

use super::Lock;
use super::lockable::{Lockable as _, Wait};
use crate::error::{Error, LostReason, Result};
use crate::key::{Key, Mode};
use crate::logging::TARGET;

/// The suffix of a resource's revocation notice.
pub(crate) const REVOKE_SUFFIX: &str = "#xtr-revoke";
/// The suffix of a resource's queue slot (`OnConflict::QueueOne`).
pub(crate) const QUEUE_SUFFIX: &str = "#xtr-queue";

/// How often a holder on a store that neither expires nor tells of changes looks for a notice.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The longest a holder on a store where locks expire goes without looking for a notice (its
/// renewals may be minutes apart).
const LOOK_AT_MOST: Duration = Duration::from_secs(5);
/// How often a revoker looks whether the holders let go, where the store does not tell.
const POLL_HOLDERS: Duration = Duration::from_millis(100);
/// The longest ttl of a notice or a queue slot: its holder renews it while it waits, and one
/// left behind by a revoker or a queued run that died (on a store where locks expire) stands
/// no longer than this, asking everyone who takes the resource meanwhile to give it up.
const SIBLING_TTL: Duration = Duration::from_secs(5);

/// What a [`Lock::revoke`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Revocation {
    /// How many held the resource when it was asked (holders of other libraries included).
    pub asked: usize,
    /// Whether the resource was free when the revocation ended (its holders let go within the
    /// wait, or there were none).
    pub let_go: bool,
}

/// Whether `resource` is one of this library's siblings (a notice, a queue slot), which are
/// neither revoked nor queued for themselves.
fn is_sibling(resource: &str) -> bool {
    resource.ends_with(REVOKE_SUFFIX) || resource.ends_with(QUEUE_SUFFIX)
}

impl Lock {
    /// Asks every current holder of the resource to give it up, and waits up to `wait` for
    /// them to let go. A holder of this library that keeps its lock alive (a guard, a scope,
    /// [`keep_alive`](crate::Lockable::keep_alive), `xtr-lock run`) is told its lock is lost
    /// with [`LostReason::Revoked`](crate::LostReason::Revoked) (its body stopped, its command
    /// stopped and `xtr-lock run` exits 3), at once where the store tells of changes, else at
    /// its next renewal or check; it then releases. Anyone who takes the resource while the
    /// revocation stands is asked too. Holders of other libraries cannot be asked: the answer
    /// then says they did not let go.
    ///
    /// # Errors
    ///
    /// An invalid argument when this lock's own holder holds the resource (release it instead);
    /// a storage error when the store failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before completing, its notice is taken down in the background (on
    /// a store where locks expire, one the process could not take down lasts at most 5 s).
    pub async fn revoke(&self, wait: Duration) -> Result<Revocation> {
        if self.held_mode().is_some() {
            return Err(Error::invalid_argument(
                "a holder cannot revoke its own lock: release it instead",
            )
            .with_resource(self.resource()));
        }
        let asked = self.holding().await?;
        if asked == 0 {
            return Ok(Revocation {
                asked,
                let_go: true,
            });
        }
        let deadline = self.key.clock().now() + wait;
        let notice = self.notice(Wait::AtMost(wait)).await?;
        let let_go = self.wait_free(deadline).await;
        if let Some(notice) = notice {
            notice.let_go("the revocation notice").await;
        }
        let let_go = let_go?;
        tracing::info!(target: TARGET, resource = self.resource(), store = %self.store, asked, let_go,
            "revoked the lock");
        Ok(Revocation { asked, let_go })
    }

    /// Posts a revocation notice for the resource within `wait` (`None`: another revoker's
    /// notice stands, which does as well).
    pub(super) async fn notice(&self, wait: Wait) -> Result<Option<Sibling>> {
        let notice = self.sibling(REVOKE_SUFFIX);
        let mode = match self.store.capabilities().shared {
            true => Mode::Read,
            false => Mode::Write,
        };
        Sibling::take(notice, mode, wait).await
    }

    /// A lock of this store on the sibling `{resource}{suffix}`, with the lock's ttl (at most
    /// [`SIBLING_TTL`]) and its holder's metadata.
    pub(super) fn sibling(&self, suffix: &str) -> Lock {
        let key = Key::with_clock(
            format!("{}{suffix}", self.resource()),
            self.key.clock().clone(),
        );
        if let Some(meta) = self.key.meta() {
            // Checked when it was set on this key.
            let _ = key.set_meta(Some(meta.to_vec()));
        }
        Lock::new(
            key,
            self.store.clone(),
            self.ttl.map_or(SIBLING_TTL, |ttl| ttl.min(SIBLING_TTL)),
        )
    }

    /// How many hold the resource now (waiters not counted).
    async fn holding(&self) -> Result<usize> {
        let holders = self.store.holders(self.resource()).await?;
        Ok(holders.iter().filter(|h| !h.waiting).count())
    }

    /// Waits until nobody holds the resource, or `deadline`; whether it was free.
    async fn wait_free(&self, deadline: std::time::Instant) -> Result<bool> {
        let clock = self.key.clock().clone();
        loop {
            let changed = self.store.watch_changes(self.resource()).await?;
            if self.holding().await? == 0 {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(clock.now());
            if left.is_zero() {
                return Ok(false);
            }
            // Not every release is seen where the store tells: look again soon all the same.
            let pause = clock.sleep(left.min(POLL_HOLDERS * 2));
            match changed {
                Some(changed) => {
                    tokio::select! {
                        () = changed => {}
                        () = pause => {}
                    }
                }
                None => clock.sleep(left.min(POLL_HOLDERS)).await,
            }
        }
    }
}

/// Looks for a revocation notice on `lock`'s resource while generation `generation` holds, and
/// marks the holder lost ([`LostReason::Revoked`]) when it finds one. `None` for a sibling, and
/// for a store that locks nothing.
pub(super) fn watch(lock: &Lock, generation: u64) -> Option<AbortOnDrop> {
    // Semaphores' permits are not revoked: a revocation is about a lock's holders.
    if is_sibling(lock.resource())
        || !lock.excludes()
        || !lock.revocable()
        || lock.key.permits().is_some()
    {
        return None;
    }
    let caps = lock.store.capabilities();
    // Where locks expire (and the store does not keep a lease of ours that it watches), each
    // renewal's period, and at least every few seconds (a replacing run waits for it); else
    // once a second, and at once where the store tells.
    let period = match lock.ttl {
        Some(ttl) if caps.expiring => (ttl / 3).clamp(Duration::from_millis(50), LOOK_AT_MOST),
        _ => LOOK_EVERY,
    };
    let native = caps.leased || !caps.expiring;
    let lock = lock.clone();
    let task = tokio::spawn(async move {
        let notice = format!("{}{REVOKE_SUFFIX}", lock.resource());
        let clock = lock.key.clock().clone();
        let mut failed = false;
        loop {
            let changed = match native {
                true => lock.store.watch_changes(&notice).await.ok().flatten(),
                false => None,
            };
            match lock.store.holders(&notice).await {
                Ok(holders) if holders.iter().any(|h| !h.waiting) => {
                    if lock.lose(generation, LostReason::Revoked).await {
                        tracing::warn!(target: TARGET, resource = lock.resource(), store = %lock.store,
                            "the lock was revoked: giving it up");
                    }
                    return;
                }
                Ok(_) => {}
                Err(err) if !failed => {
                    failed = true;
                    tracing::warn!(target: TARGET, resource = lock.resource(), store = %lock.store, error = %err,
                        "could not look for a revocation of the lock (trying again; said once)");
                }
                Err(err) => {
                    tracing::debug!(target: TARGET, resource = lock.resource(), store = %lock.store, error = %err,
                        "could not look for a revocation");
                }
            }
            match changed {
                Some(changed) => {
                    tokio::select! {
                        () = changed => {}
                        // Not every change is seen (flock's acquisitions by other processes
                        // make no file event): look each period all the same.
                        () = clock.sleep(period) => {}
                    }
                }
                None => clock.sleep(period).await,
            }
        }
    });
    Some(AbortOnDrop(task.abort_handle()))
}

/// A sibling lock held (a notice, a queue slot), kept alive; let go in the background if
/// dropped before [`let_go`](Sibling::let_go) (its holder's wait was dropped).
pub(super) struct Sibling {
    lock: Option<Lock>,
    _alive: crate::lock::lost::KeepAlive,
}

impl Sibling {
    /// Takes `lock` in `mode` within `wait` and keeps it alive; `None` when it is held by
    /// someone else.
    pub(super) async fn take(lock: Lock, mode: Mode, wait: Wait) -> Result<Option<Sibling>> {
        if !lock.acquire_with(mode, wait).await? {
            return Ok(None);
        }
        match lock.keep_alive() {
            Ok(alive) => Ok(Some(Sibling {
                lock: Some(lock),
                _alive: alive,
            })),
            Err(err) => {
                lock.release_in_background();
                Err(err)
            }
        }
    }

    /// Releases it; a failure is logged (it is then held until its ttl).
    pub(super) async fn let_go(mut self, what: &str) {
        let Some(lock) = self.lock.take() else {
            return;
        };
        if let Err(err) = lock.release().await {
            tracing::warn!(target: TARGET, resource = lock.resource(), store = %lock.store, error = %err,
                "could not let {what} go: it is held until its ttl");
        }
    }
}

impl Drop for Sibling {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            lock.release_in_background();
        }
    }
}

/// Aborts its task when dropped.
pub(super) struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
