//! Metrics on the `metrics` facade (feature `metrics`; without it every function here does
//! nothing). Labels name the store's kind (`redis`, `flock`, `combined`, …), the mode and the
//! outcome, never a resource (unbounded) or a credential.
//!
//! - `xtr_lock_acquire_seconds` (histogram; `store`, `mode`, `outcome` = `acquired` |
//!   `conflict` | `timeout` | `error` | `cancelled`): how long each acquire call took;
//! - `xtr_lock_waits_total` (`store`): acquires that waited for a holder;
//! - `xtr_lock_contended_total` (`store`): acquires whose first attempt found the lock held.
//!   Stores that wait in the server in one call (flock, session locks) go straight to their
//!   wait when no key can have travelled to them: those waits are counted only in the latency
//!   histogram;
//! - `xtr_lock_held` (gauge): locks this process holds now;
//! - `xtr_lock_lost_total` (`reason` = `removed` | `expired` | `taken_over` | `replaced` |
//!   `unreachable` | `disconnected`): holds found lost;
//! - `xtr_lock_refresh_failures_total` (`store`): refreshes that failed for another reason
//!   than a loss.

use std::fmt::Display;

use crate::error::LostReason;
use crate::mode::Mode;

/// A store's kind, as labels show it: its `Display` up to the first `:` or `(`. (A store is
/// taken as what it displays, so that this module, which the holder uses, needs no store.)
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn kind(store: &dyn Display) -> String {
    let shown = store.to_string();
    let end = shown.find([':', '(']).unwrap_or(shown.len());
    shown[..end].to_owned()
}

/// A loss reason as a label: one word.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn reason_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Removed => "removed",
        LostReason::Expired => "expired",
        LostReason::TakenOver => "taken_over",
        LostReason::Replaced => "replaced",
        LostReason::Unreachable => "unreachable",
        LostReason::Disconnected => "disconnected",
    }
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Write => "write",
        Mode::Read => "read",
    }
}

/// Times one acquire call; a call dropped before [`finish`](AcquireTimer::finish) is recorded as
/// `cancelled`.
pub(crate) struct AcquireTimer {
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
    #[cfg(feature = "metrics")]
    labels: Option<(String, &'static str)>,
}

impl AcquireTimer {
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn start(store: &dyn Display, mode: Mode) -> AcquireTimer {
        AcquireTimer {
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
            #[cfg(feature = "metrics")]
            labels: Some((kind(store), mode_name(mode))),
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables, unused_mut))]
    pub(crate) fn finish(mut self, outcome: &'static str) {
        #[cfg(feature = "metrics")]
        if let Some((store, mode)) = self.labels.take() {
            metrics::histogram!("xtr_lock_acquire_seconds",
                "store" => store, "mode" => mode, "outcome" => outcome)
            .record(self.started.elapsed().as_secs_f64());
        }
    }
}

impl Drop for AcquireTimer {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some((store, mode)) = self.labels.take() {
            metrics::histogram!("xtr_lock_acquire_seconds",
                "store" => store, "mode" => mode, "outcome" => "cancelled")
            .record(self.started.elapsed().as_secs_f64());
        }
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn waited(store: &dyn Display) {
    #[cfg(feature = "metrics")]
    metrics::counter!("xtr_lock_waits_total", "store" => kind(store)).increment(1);
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn contended(store: &dyn Display) {
    #[cfg(feature = "metrics")]
    metrics::counter!("xtr_lock_contended_total", "store" => kind(store)).increment(1);
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn refresh_failed(store: &dyn Display) {
    #[cfg(feature = "metrics")]
    metrics::counter!("xtr_lock_refresh_failures_total", "store" => kind(store)).increment(1);
}

/// The process began (`true`) or stopped (`false`) holding a lock.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn held(now: bool) {
    #[cfg(feature = "metrics")]
    {
        let gauge = metrics::gauge!("xtr_lock_held");
        if now {
            gauge.increment(1.0);
        } else {
            gauge.decrement(1.0);
        }
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn lost(reason: LostReason) {
    #[cfg(feature = "metrics")]
    metrics::counter!("xtr_lock_lost_total", "reason" => reason_label(reason)).increment(1);
}
