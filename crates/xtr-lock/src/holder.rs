//! What the locks of one holder believe about it, and its executor.
//!
//! A [`Key`](crate::Key) is identity; this is the lock's bookkeeping, which every lock built on
//! the key shares (they are one holder). The key carries it without knowing what is in it.

use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::error::LostReason;
use crate::mode::Mode;

/// The believed state of a holder, and its generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Believed {
    pub(crate) hold: Hold,
    /// Bumped each time the holder goes from holding nothing to holding; mode changes and
    /// re-saves keep it. A monitor watches one generation.
    pub(crate) generation: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Holds nothing, as far as the holder knows (never acquired, or released).
    Free,
    /// Holds in `mode`, with the fencing token of the exclusive acquisition.
    Held { mode: Mode, fencing: Option<u64> },
    /// Held, then found lost, and not released since: a release reports it.
    Lost(LostReason),
}

pub(crate) struct Holder {
    state: watch::Sender<Believed>,
    /// Runs the store calls of this holder, one at a time, each to its end.
    serial: crate::serial::Serial,
    /// When the holder's current (or last) wait began; the Unix epoch before its first. Given
    /// to a store when the holder registers as a waiter (stores that queue waiters order them
    /// by it).
    wait_began: Mutex<SystemTime>,
    /// The kind of store its locks are in, as metrics label it (set by the first lock built on
    /// the key).
    store: OnceLock<String>,
    /// When the holder's current hold began (on its key's clock), with that hold's generation.
    since: Mutex<Option<(u64, Instant)>>,
    /// Set when a release holding on for a minimum hold must let go at once.
    cut: watch::Sender<bool>,
}

impl Holder {
    pub(crate) fn new() -> Self {
        let (state, _) = watch::channel(Believed {
            hold: Hold::Free,
            generation: 0,
        });
        Holder {
            state,
            serial: crate::serial::Serial::default(),
            wait_began: Mutex::new(UNIX_EPOCH),
            store: OnceLock::new(),
            since: Mutex::new(None),
            cut: watch::channel(false).0,
        }
    }

    /// Names the kind of store the holder's locks are in, for its metrics (the first name
    /// given stays: one holder, one store).
    pub(crate) fn in_store(&self, store: &dyn std::fmt::Display) {
        self.store.get_or_init(|| crate::telemetry::kind(store));
    }

    fn store(&self) -> &str {
        self.store.get().map_or("unknown", String::as_str)
    }

    /// Notes that the holder begins to wait (its first attempt was refused).
    pub(crate) fn begins_waiting(&self) {
        *crate::mutex::lock(&self.wait_began) = SystemTime::now();
    }

    /// When the holder's current (or last) wait began (the Unix epoch: never).
    pub(crate) fn wait_began(&self) -> SystemTime {
        *crate::mutex::lock(&self.wait_began)
    }

    pub(crate) fn believed(&self) -> Believed {
        *self.state.borrow()
    }

    /// The mode it holds in, if it believes it holds.
    pub(crate) fn mode(&self) -> Option<Mode> {
        match self.believed().hold {
            Hold::Held { mode, .. } => Some(mode),
            Hold::Free | Hold::Lost(_) => None,
        }
    }

    pub(crate) fn fencing_token(&self) -> Option<u64> {
        match self.believed().hold {
            Hold::Held { fencing, .. } => fencing,
            Hold::Free | Hold::Lost(_) => None,
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.believed().generation
    }

    /// Changes of the believed state, from now on.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Believed> {
        self.state.subscribe()
    }

    /// Marks `now` as the start of the current hold, unless that hold's start is known.
    pub(crate) fn mark_since(&self, now: Instant) {
        let generation = self.generation();
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if since.is_none_or(|(g, _)| g != generation) {
            *since = Some((generation, now));
            self.cut.send_replace(false);
        }
    }

    /// Ends a minimum hold being waited out now, or the next one (until the next acquisition).
    pub(crate) fn cut_min_hold(&self) {
        self.cut.send_replace(true);
    }

    /// Completes once [`cut_min_hold`](Holder::cut_min_hold) was called since the hold began.
    pub(crate) fn min_hold_cut(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut cut = self.cut.subscribe();
        async move {
            let _ = cut.wait_for(|cut| *cut).await;
        }
    }

    /// When the hold of `generation` began, if it was marked.
    pub(crate) fn since(&self, generation: u64) -> Option<Instant> {
        let since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        since.filter(|(g, _)| *g == generation).map(|(_, at)| at)
    }

    /// A store granted `mode`, with the fencing token it gave.
    pub(crate) fn acquired(&self, mode: Mode, fencing: Option<u64>) {
        self.state.send_modify(|b| {
            b.hold = match b.hold {
                Hold::Held {
                    mode: was,
                    fencing: kept,
                } => Hold::Held {
                    mode,
                    // A re-save in the same mode keeps its token (a store may then report
                    // none: nothing new was granted).
                    fencing: fencing.or(kept.filter(|_| was == mode)),
                },
                Hold::Free | Hold::Lost(_) => {
                    b.generation += 1;
                    crate::telemetry::held(self.store(), true);
                    Hold::Held { mode, fencing }
                }
            };
        });
    }

    /// A store says the holder holds in `mode` (it asked, or refreshed).
    pub(crate) fn found_held(&self, mode: Mode) {
        self.state.send_if_modified(|b| {
            let next = match b.hold {
                Hold::Held { mode: was, .. } if was == mode => return false,
                // Revoked: the store still holds it until the holder lets go, which a check or
                // a renewal racing the revocation must not undo (its monitor would take the
                // new generation for a release and never tell the holder).
                Hold::Lost(LostReason::Revoked) => return false,
                Hold::Held { fencing, .. } => Hold::Held {
                    mode,
                    fencing: fencing.filter(|_| mode == Mode::Write),
                },
                // A key that travelled from another process, or a lock found again: a new
                // generation, with no fencing token known here.
                Hold::Free | Hold::Lost(_) => {
                    b.generation += 1;
                    crate::telemetry::held(self.store(), true);
                    Hold::Held {
                        mode,
                        fencing: None,
                    }
                }
            };
            b.hold = next;
            true
        });
    }

    /// A store says the holder holds nothing. A holder that believed it held has lost its lock,
    /// for `reason`; returns whether that is news.
    pub(crate) fn found_not_held(&self, reason: LostReason) -> bool {
        let mut lost = false;
        self.state.send_if_modified(|b| match b.hold {
            Hold::Held { .. } => {
                b.hold = Hold::Lost(reason);
                crate::telemetry::held(self.store(), false);
                crate::telemetry::lost(self.store(), reason);
                lost = true;
                true
            }
            Hold::Free | Hold::Lost(_) => false,
        });
        lost
    }

    /// The lock of generation `generation` is lost, if the holder still believes it holds it.
    /// Returns whether it did.
    pub(crate) fn lose(&self, generation: u64, reason: LostReason) -> bool {
        let mut lost = false;
        self.state.send_if_modified(|b| {
            if b.generation == generation && matches!(b.hold, Hold::Held { .. }) {
                b.hold = Hold::Lost(reason);
                crate::telemetry::held(self.store(), false);
                crate::telemetry::lost(self.store(), reason);
                lost = true;
            }
            lost
        });
        lost
    }

    /// The holder released (or gave up) what it held.
    pub(crate) fn released(&self) {
        self.state.send_if_modified(|b| {
            if matches!(b.hold, Hold::Held { .. }) {
                crate::telemetry::held(self.store(), false);
            }
            let changed = b.hold != Hold::Free;
            b.hold = Hold::Free;
            changed
        });
    }

    /// The executor of this holder's store calls.
    pub(crate) fn serial(&self) -> &crate::serial::Serial {
        &self.serial
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_count_new_holds_not_mode_changes() {
        let h = Holder::new();
        assert_eq!(h.generation(), 0);
        h.acquired(Mode::Read, None);
        assert_eq!((h.mode(), h.generation()), (Some(Mode::Read), 1));
        h.acquired(Mode::Write, Some(7));
        assert_eq!((h.fencing_token(), h.generation()), (Some(7), 1));
        h.acquired(Mode::Write, None);
        assert_eq!(h.fencing_token(), Some(7), "a re-save keeps the token");
        h.found_held(Mode::Read);
        assert_eq!((h.mode(), h.fencing_token()), (Some(Mode::Read), None));
        h.released();
        h.acquired(Mode::Write, Some(9));
        assert_eq!(h.generation(), 2);
    }

    #[test]
    fn a_loss_is_recorded_once_and_only_for_its_generation() {
        let h = Holder::new();
        h.acquired(Mode::Write, None);
        assert!(!h.lose(0, LostReason::Expired), "an older generation");
        assert!(h.lose(1, LostReason::Expired));
        assert!(!h.lose(1, LostReason::Removed), "already lost");
        assert_eq!(h.believed().hold, Hold::Lost(LostReason::Expired));
        assert!(!h.found_not_held(LostReason::Removed));
        h.released();
        assert_eq!(h.believed().hold, Hold::Free);
        assert!(
            !h.found_not_held(LostReason::Removed),
            "a free holder loses nothing"
        );
    }

    #[test]
    fn a_travelled_holder_found_holding_gets_a_generation() {
        let h = Holder::new();
        h.found_held(Mode::Read);
        assert_eq!((h.mode(), h.generation()), (Some(Mode::Read), 1));
        h.found_held(Mode::Read);
        assert_eq!(h.generation(), 1);
    }

    /// A check that finds a revoked holder's lock still stored (it is, until the holder lets
    /// go) does not make it a holder again: the monitor would see a new generation and stop
    /// without telling anyone (seen on SysV under load: the revoked run never stopped).
    #[test]
    fn a_revoked_holder_is_not_revived_by_a_check() {
        let h = Holder::new();
        h.acquired(Mode::Write, None);
        assert!(h.lose(1, LostReason::Revoked));
        h.found_held(Mode::Write);
        assert_eq!(h.believed().hold, Hold::Lost(LostReason::Revoked));
        assert_eq!(h.generation(), 1);
        // A new acquisition is a new hold.
        h.acquired(Mode::Write, None);
        assert_eq!((h.mode(), h.generation()), (Some(Mode::Write), 2));
    }
}
