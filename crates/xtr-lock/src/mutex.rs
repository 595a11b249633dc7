//! The one way this crate takes a `std::sync::Mutex`: poison-tolerant.
//!
//! A panic while a guard was held poisons the mutex. Everything this crate keeps behind one
//! is plain state whose every update is a single assignment or collection operation, valid at
//! each step, so the guard is taken anyway: a panic in one caller (a user's callback, a test)
//! must not make every later lock operation of the process a second panic.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
