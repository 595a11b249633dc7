//! A task per holder, found through the holder's key: what the stores share whose lock belongs
//! to something of the holder's own (a database session, an etcd lease). Callers send the task
//! commands and await the answer; the task publishes what the holder holds, for loss watchers.

use std::sync::Mutex;

use tokio::sync::{mpsc, oneshot, watch};

use super::LossWatcher;
use crate::error::{Error, LostReason, Result};
use crate::key::Mode;
use crate::mutex::lock;

/// What a holder task publishes about its holds.
pub(crate) trait Life: Copy + Send + Sync + 'static {
    /// The mode held now, if any.
    fn held(&self) -> Option<Mode>;
    /// How many holds have ended (released or lost).
    fn ended(&self) -> u64;
    /// Why the last hold ended without a release.
    fn lost(&self) -> Option<LostReason>;
}

/// The caller's end of a holder task.
pub(crate) struct Task<C, L> {
    pub(crate) tx: mpsc::UnboundedSender<C>,
    pub(crate) life: watch::Receiver<L>,
}

/// A holder's task, kept on its key and started on first use.
pub(crate) struct Tasks<C, L> {
    slot: Mutex<Option<Task<C, L>>>,
}

impl<C, L> Default for Tasks<C, L> {
    fn default() -> Self {
        Tasks {
            slot: Mutex::new(None),
        }
    }
}

impl<C, L: Life> Tasks<C, L> {
    /// Where to send commands: the running task, or one `start` starts (also in place of a
    /// task that stopped).
    pub(crate) fn sender(&self, start: impl FnOnce() -> Task<C, L>) -> mpsc::UnboundedSender<C> {
        let mut slot = lock(&self.slot);
        match slot.as_ref() {
            Some(task) if !task.tx.is_closed() => task.tx.clone(),
            _ => {
                let task = start();
                let tx = task.tx.clone();
                *slot = Some(task);
                tx
            }
        }
    }

    /// Where to send commands, if a task was ever started.
    pub(crate) fn existing_sender(&self) -> Option<mpsc::UnboundedSender<C>> {
        lock(&self.slot).as_ref().map(|t| t.tx.clone())
    }

    /// What the task last published, if there is one.
    pub(crate) fn life(&self) -> Option<L> {
        lock(&self.slot).as_ref().map(|t| *t.life.borrow())
    }

    /// Completes when the hold of the moment ends (released, lost, or the task gone: `gone`),
    /// with why. Without a task, at once with `Removed`.
    pub(crate) fn loss_watcher(&self, gone: LostReason) -> LossWatcher {
        let Some(mut life) = lock(&self.slot).as_ref().map(|t| t.life.clone()) else {
            return LossWatcher::new(async { LostReason::Removed });
        };
        let start = *life.borrow();
        LossWatcher::new(async move {
            loop {
                let now: L = *life.borrow_and_update();
                if now.held().is_none() || now.ended() != start.ended() {
                    return now.lost().unwrap_or(LostReason::Removed);
                }
                if life.changed().await.is_err() {
                    // The task is gone (its runtime ended), and what it held with it.
                    return gone;
                }
            }
        })
    }
}

/// Sends the command `cmd` makes to a holder task and awaits its answer; `gone` is the error
/// when the task stopped.
///
/// # Cancel safety
///
/// Cancel-safe for the caller: dropped, it only drops its end of the answer, and the task
/// finishes the command.
pub(crate) async fn ask<C, T>(
    tx: mpsc::UnboundedSender<C>,
    cmd: impl FnOnce(oneshot::Sender<Result<T>>) -> C,
    gone: impl Fn() -> Error,
) -> Result<T> {
    let (reply, answer) = oneshot::channel();
    tx.send(cmd(reply)).map_err(|_| gone())?;
    answer.await.map_err(|_| gone())?
}
