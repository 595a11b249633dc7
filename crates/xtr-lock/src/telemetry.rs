//! Metrics on the `metrics` facade (feature `metrics`; without it every function here does
//! nothing). Every series carries the `store` label, the store's kind (`redis`, `flock`,
//! `combined`, …); some add the mode, the outcome or the loss reason; no label ever carries a
//! resource (unbounded) or a credential. The series, their help texts and units are in
//! [`METRICS`]; they are described to the recorder once, on the first metric this process
//! records, and again by [`describe_metrics`].

use std::fmt::Display;

/// One metric xtr-lock records: its name, its type, and the help text exporters show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricInfo {
    /// The series' name, `xtr_lock_…`.
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its labels besides `store`.
    pub labels: &'static [&'static str],
    /// What it counts or measures (the exporter's `# HELP`).
    pub help: &'static str,
}

/// Every metric xtr-lock records (with the `metrics` feature).
pub const METRICS: &[MetricInfo] = &[
    MetricInfo {
        name: "xtr_lock_acquire_seconds",
        kind: "histogram",
        labels: &["mode", "outcome"],
        help: "How long each acquire call took, in seconds, by mode (write, read, or permits \
               for a semaphore's) and outcome: acquired, conflict (refused without waiting), \
               timeout, error or cancelled (the call was dropped).",
    },
    MetricInfo {
        name: "xtr_lock_waits_total",
        kind: "counter",
        labels: &[],
        help: "Acquire calls that waited for a holder.",
    },
    MetricInfo {
        name: "xtr_lock_contended_total",
        kind: "counter",
        labels: &[],
        help: "Acquire calls whose first attempt found the lock held (stores that wait in the \
               server in one call count their waits only in xtr_lock_acquire_seconds).",
    },
    MetricInfo {
        name: "xtr_lock_held",
        kind: "gauge",
        labels: &[],
        help: "Locks this process holds now.",
    },
    MetricInfo {
        name: "xtr_lock_lost_total",
        kind: "counter",
        labels: &["reason"],
        help: "Held locks found lost, by reason: removed, expired, taken_over, replaced, \
               unreachable or disconnected.",
    },
    MetricInfo {
        name: "xtr_lock_refresh_failures_total",
        kind: "counter",
        labels: &[],
        help: "Refreshes that failed for another reason than a lost lock.",
    },
];

/// Bucket bounds (seconds) that suit `xtr_lock_acquire_seconds`, from a 50 µs uncontended
/// acquire on a local store to a wait of minutes. Exporters that keep histograms as summaries
/// unless told otherwise (metrics-exporter-prometheus) take them as
/// `PrometheusBuilder::set_buckets_for_metric(Matcher::Full("xtr_lock_acquire_seconds".into()),
/// ACQUIRE_SECONDS_BUCKETS)`.
pub const ACQUIRE_SECONDS_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Describes every metric in [`METRICS`] (help text and unit) to the recorder installed now.
/// The first metric a process records does this once by itself; call it after installing a
/// recorder later than that, or under a local recorder. Does nothing without the `metrics`
/// feature.
pub fn describe_metrics() {
    #[cfg(feature = "metrics")]
    for metric in METRICS {
        let (name, help) = (metric.name, metric.help);
        match metric.kind {
            "histogram" => metrics::describe_histogram!(name, metrics::Unit::Seconds, help),
            "gauge" => metrics::describe_gauge!(name, metrics::Unit::Count, help),
            _ => metrics::describe_counter!(name, metrics::Unit::Count, help),
        }
    }
}

/// Describes the metrics on the first one recorded.
#[cfg(feature = "metrics")]
fn described() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(describe_metrics);
}

use crate::error::LostReason;
use crate::mode::Mode;

/// A store's kind, as labels show it: its `Display` up to the first `:` or `(`. (A store is
/// taken as what it displays, so that this module, which the holder uses, needs no store.)
pub(crate) fn kind(store: &dyn Display) -> String {
    let shown = store.to_string();
    let end = shown.find([':', '(']).unwrap_or(shown.len());
    shown[..end].to_owned()
}

/// A loss reason as a label: one word.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn reason_label(reason: LostReason) -> &'static str {
    reason.label()
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
    /// `permits`: a semaphore's holder, labelled `mode="permits"`.
    pub(crate) fn start(store: &dyn Display, mode: Mode, permits: bool) -> AcquireTimer {
        AcquireTimer {
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
            #[cfg(feature = "metrics")]
            labels: Some((
                kind(store),
                if permits { "permits" } else { mode_name(mode) },
            )),
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(unused_variables, unused_mut))]
    pub(crate) fn finish(mut self, outcome: &'static str) {
        #[cfg(feature = "metrics")]
        if let Some((store, mode)) = self.labels.take() {
            described();
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
            described();
            metrics::histogram!("xtr_lock_acquire_seconds",
                "store" => store, "mode" => mode, "outcome" => "cancelled")
            .record(self.started.elapsed().as_secs_f64());
        }
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn waited(store: &dyn Display) {
    #[cfg(feature = "metrics")]
    {
        described();
        metrics::counter!("xtr_lock_waits_total", "store" => kind(store)).increment(1);
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn contended(store: &dyn Display) {
    #[cfg(feature = "metrics")]
    {
        described();
        metrics::counter!("xtr_lock_contended_total", "store" => kind(store)).increment(1);
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn refresh_failed(store: &dyn Display) {
    #[cfg(feature = "metrics")]
    {
        described();
        metrics::counter!("xtr_lock_refresh_failures_total", "store" => kind(store)).increment(1);
    }
}

/// The process began (`true`) or stopped (`false`) holding a lock in a store of kind `store`.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn held(store: &str, now: bool) {
    #[cfg(feature = "metrics")]
    {
        described();
        let gauge = metrics::gauge!("xtr_lock_held", "store" => store.to_owned());
        if now {
            gauge.increment(1.0);
        } else {
            gauge.decrement(1.0);
        }
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn lost(store: &str, reason: LostReason) {
    #[cfg(feature = "metrics")]
    {
        described();
        metrics::counter!("xtr_lock_lost_total",
            "store" => store.to_owned(), "reason" => reason_label(reason))
        .increment(1);
    }
}
