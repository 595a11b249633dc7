//! The `tracing` target of every event this crate logs, for every module to use.

/// The log target: `xtr_lock`.
pub(crate) const TARGET: &str = "xtr_lock";
