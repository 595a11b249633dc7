//! The one way this crate takes a `std::sync::Mutex`: poison-tolerant.
//!
//! What the suite keeps behind one (which worker runs which `xtr-lock`, and its section) is
//! replaced by a single assignment, valid at each step: a panic in one worker thread must not
//! turn the fault thread's next look into a second panic.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
