//! One candidate's state: its lock while it leads, the task that watches the leadership, and
//! the rules that keep `is_leader`, the state and the store in step (every change of the
//! state and of `leading` happens under the state's mutex).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::Leadership;
use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::lock::factory::LockFactory;
use crate::lock::lockable::Lockable as _;
use crate::lock::lost::{KeepAlive, LockLost};
use crate::mutex::lock as locked;

pub(super) struct Inner {
    pub(super) factory: LockFactory,
    pub(super) name: String,
    pub(super) recampaign: AtomicBool,
    pub(super) leading: watch::Sender<bool>,
    /// Bumped (under the state's mutex) by every campaign and resignation: a campaign or
    /// re-campaign started before one installs nothing, and a waiting one gives up.
    pub(super) epoch: watch::Sender<u64>,
    /// Bumped by every resignation: a campaign that was called before it gives up, even one
    /// still queued behind another campaign of this candidate.
    pub(super) resigned: watch::Sender<u64>,
    /// One campaign of this candidate at a time (a resignation does not wait for it).
    pub(super) turn: tokio::sync::Mutex<()>,
    pub(super) state: Mutex<State>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) lock: Option<Lock>,
    keep: Option<KeepAlive>,
    pub(super) leadership: Option<Leadership>,
    /// The task that watches the leadership for loss (and campaigns again after one).
    monitor: Option<tokio::task::AbortHandle>,
}

impl State {
    /// Ends the current leadership (and a re-campaign under way) without releasing: the lock
    /// is returned to the caller. Its watchers see the leadership end without a loss.
    pub(super) fn end(&mut self, leading: &watch::Sender<bool>) -> Option<Lock> {
        if let Some(task) = self.monitor.take() {
            task.abort();
        }
        self.keep = None;
        self.leadership = None;
        leading.send_replace(false);
        self.lock.take()
    }
}

impl Inner {
    pub(super) fn new(factory: LockFactory, name: String) -> Self {
        Inner {
            factory,
            name,
            recampaign: AtomicBool::new(false),
            leading: watch::channel(false).0,
            epoch: watch::channel(0).0,
            resigned: watch::channel(0).0,
            turn: tokio::sync::Mutex::new(()),
            state: Mutex::new(State::default()),
        }
    }

    /// A new epoch (call with the state's mutex held): what was under way gives up.
    pub(super) fn bump(&self) -> u64 {
        self.epoch.send_modify(|e| *e += 1);
        *self.epoch.borrow()
    }

    /// The lock a campaign of this candidate takes: a new holder carrying `value`, always
    /// renewed (a leader's lease must not lapse because the factory's locks are not renewed).
    pub(super) fn new_lock(&self, value: Vec<u8>) -> Result<Lock> {
        self.factory
            .create_lock(&self.name)
            .with_keep_alive(true)
            .with_meta(value)
    }

    /// Makes `lock`, just acquired by the campaign of `epoch`, this candidate's leadership,
    /// unless a resignation or another campaign came since (then it lets it go).
    pub(super) fn install(this: &Arc<Inner>, lock: Lock, epoch: u64) -> Result<Leadership> {
        let keep = match lock.keep_alive() {
            Ok(keep) => keep,
            Err(err) => {
                lock.release_in_background();
                return Err(err);
            }
        };
        let (lost_tx, lost_rx) = watch::channel(None);
        let leadership = Leadership {
            term: lock.fencing_token(),
            since: SystemTime::now(),
            lost: lost_rx,
        };
        let mut st = locked(&this.state);
        if *this.epoch.borrow() != epoch {
            lock.release_in_background();
            return Err(Error::conflict(this.name.clone())
                .with_reason("a resignation or another campaign of this candidate came first"));
        }
        let watch_loss = keep.lost();
        let weak = Arc::downgrade(this);
        let monitor = tokio::spawn(async move {
            let lost = watch_loss.await;
            Inner::after_loss(weak, epoch, lost, lost_tx).await;
        });
        st.lock = Some(lock);
        st.keep = Some(keep);
        st.leadership = Some(leadership.clone());
        st.monitor = Some(monitor.abort_handle());
        this.leading.send_replace(true);
        Ok(leadership)
    }

    /// After the leadership of `epoch` was lost: stop leading (before the loss is published,
    /// so whoever sees it finds the candidate no longer leading), then campaign again if asked.
    async fn after_loss(
        weak: Weak<Inner>,
        epoch: u64,
        lost: LockLost,
        lost_tx: watch::Sender<Option<LockLost>>,
    ) {
        let again = weak.upgrade().and_then(|this| {
            let mut st = locked(&this.state);
            if *this.epoch.borrow() != epoch {
                return None;
            }
            // This task is the monitor: it must not abort itself.
            let me = st.monitor.take();
            let lock = st.end(&this.leading)?;
            lock.release_in_background();
            tracing::warn!(target: crate::logging::TARGET, election = %this.name,
                reason = %lost.reason, "leadership lost");
            if !this.recampaign.load(Ordering::Relaxed) {
                return None;
            }
            // Campaigning again, it stays the task a resignation or a campaign aborts.
            st.monitor = me;
            let value = lock.key().meta().map(|v| v.to_vec()).unwrap_or_default();
            Some((value, this.factory.clone(), this.name.clone()))
        });
        lost_tx.send_replace(Some(lost));
        if let Some((value, factory, name)) = again {
            Inner::campaign_again(weak, epoch, value, factory, name).await;
        }
    }

    /// Campaigns until it leads again (backing off after store errors), unless the candidate
    /// resigns, campaigns by itself, or goes meanwhile.
    async fn campaign_again(
        weak: Weak<Inner>,
        epoch: u64,
        value: Vec<u8>,
        factory: LockFactory,
        name: String,
    ) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let lock = match factory
                .create_lock(&name)
                .with_keep_alive(true)
                .with_meta(value.clone())
            {
                Ok(lock) => lock,
                Err(_) => return,
            };
            match lock.acquire().await {
                Ok(()) => {
                    let Some(this) = weak.upgrade() else {
                        lock.release_in_background();
                        return;
                    };
                    // The monitor of the new leadership takes over; this task ends.
                    let _ = Inner::install(&this, lock, epoch);
                    return;
                }
                Err(err) => {
                    tracing::warn!(target: crate::logging::TARGET, election = %name,
                        error = %err, "campaigning again failed; retrying");
                    if weak.strong_count() == 0 {
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let st = match self.state.get_mut() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(lock) = st.end(&self.leading) {
            lock.release_in_background();
        }
    }
}
