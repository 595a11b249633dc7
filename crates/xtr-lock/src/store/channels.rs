//! Per-name change channels, shared by the stores that wake their own waiters in-process (the
//! in-memory store per resource, the flock store per lock file).

use std::collections::HashMap;

use tokio::sync::watch;

/// A `watch` channel per name, bumped on every change. Receivers are registered (and their
/// current value marked seen) when subscribed, so no change after that is missed. Channels
/// nobody listens to are dropped after a change, or swept (amortised) on subscription.
#[derive(Default)]
pub(crate) struct Channels {
    senders: HashMap<String, watch::Sender<u64>>,
    sweep_at: usize,
}

impl Channels {
    /// A receiver that changes on the next [`notify`](Channels::notify) of `name`.
    pub(crate) fn subscribe(&mut self, name: &str) -> watch::Receiver<u64> {
        if self.senders.len() > self.sweep_at {
            // Channels whose listeners all left without a change would pile up otherwise.
            self.senders.retain(|_, tx| tx.receiver_count() > 0);
            self.sweep_at = (self.senders.len() * 2).max(64);
        }
        let mut rx = match self.senders.get(name) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(0);
                self.senders.insert(name.to_owned(), tx);
                rx
            }
        };
        rx.mark_unchanged();
        rx
    }

    /// Wakes every listener of `name`.
    pub(crate) fn notify(&mut self, name: &str) {
        if let Some(tx) = self.senders.get(name) {
            tx.send_modify(|v| *v = v.wrapping_add(1));
            if tx.receiver_count() == 0 {
                self.senders.remove(name);
            }
        }
    }

    /// Wakes every listener of every name.
    pub(crate) fn notify_all(&self) {
        for tx in self.senders.values() {
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// Drops the channels nobody listens to; whether any listener is left at all.
    pub(crate) fn retain_listened(&mut self) -> bool {
        self.senders.retain(|_, tx| tx.receiver_count() > 0);
        !self.senders.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.senders.len()
    }
}
