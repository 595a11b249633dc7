//! FIFO among one process's flock waiters: per lock file, the waiters of this process in the
//! order they began waiting. Only the waiters at the head attempt (the first writer, or the
//! readers before any writer), and this process's newcomers do not attempt past them. Other
//! processes know nothing of it and still get in first (see `docs/flock.md`, "Fairness: why
//! not"). A free lock costs one atomic load more: the line is looked at only while it counts a
//! waiter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::FlockStore;
use crate::error::Result;
use crate::key::{Key, Mode};
use crate::mutex::lock;
use crate::store::{Conflict, Saved};

/// The lines of one lock directory (in its hub, shared by every store on it in this process).
#[derive(Default)]
pub(crate) struct Lines {
    lines: Mutex<HashMap<String, Vec<(u64, Mode)>>>,
    /// Waiters in every line (none: nothing to look at).
    waiting: AtomicUsize,
    next: AtomicU64,
}

/// Whether a waiter in `mode` may attempt behind `ahead`: a writer first, a reader behind
/// readers only.
fn passes(ahead: &[(u64, Mode)], mode: Mode) -> bool {
    match mode {
        Mode::Write => ahead.is_empty(),
        Mode::Read => ahead.iter().all(|(_, m)| *m == Mode::Read),
    }
}

impl Lines {
    /// Whether a newcomer of this process in `mode` may attempt `name` (`name` is made only
    /// while someone waits).
    pub(crate) fn open_to(&self, name: impl FnOnce() -> String, mode: Mode) -> bool {
        if self.waiting.load(Ordering::Acquire) == 0 {
            return true;
        }
        lock(&self.lines)
            .get(&name())
            .is_none_or(|line| passes(line, mode))
    }

    /// Puts a waiter in `mode` at the end of `name`'s line; it leaves when the place drops,
    /// and then calls `wake` (the waiters behind it may attempt now).
    pub(crate) fn join(
        self: &Arc<Self>,
        name: &str,
        mode: Mode,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> Place {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.lines)
            .entry(name.to_owned())
            .or_default()
            .push((id, mode));
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Place {
            lines: self.clone(),
            name: name.to_owned(),
            id,
            mode,
            wake: Box::new(wake),
        }
    }
}

impl Lines {
    /// Waiters in every line, for tests.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }
}

/// A waiter's place in its line.
pub(crate) struct Place {
    lines: Arc<Lines>,
    name: String,
    id: u64,
    mode: Mode,
    wake: Box<dyn Fn() + Send + Sync>,
}

impl Place {
    /// Whether it is this waiter's turn to attempt.
    pub(crate) fn turn(&self) -> bool {
        let lines = lock(&self.lines.lines);
        let line = lines.get(&self.name).map(Vec::as_slice).unwrap_or_default();
        let at = line
            .iter()
            .position(|(id, _)| *id == self.id)
            .unwrap_or(line.len());
        passes(&line[..at], self.mode)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        {
            let mut lines = lock(&self.lines.lines);
            if let Some(line) = lines.get_mut(&self.name) {
                line.retain(|(id, _)| *id != self.id);
                if line.is_empty() {
                    lines.remove(&self.name);
                }
            }
        }
        self.lines.waiting.fetch_sub(1, Ordering::AcqRel);
        (self.wake)();
    }
}

impl FlockStore {
    /// Whether `key`'s holder may attempt in `mode` now, past this process's waiters: a holder
    /// changing mode always may (it holds already), a newcomer only where no waiter stands in
    /// its way.
    pub(super) fn may_pass_the_line(&self, key: &Key, mode: Mode) -> bool {
        let lines = self.inner.hub.lines();
        lines.open_to(|| self.file_name(key.resource()), mode) || self.local_mode(key).is_some()
    }

    /// A `try`'s attempt: refused without touching the file where this process's waiters
    /// stand in its way.
    pub(super) fn attempt_in_line(&self, key: &Key, mode: Mode) -> Result<Saved> {
        if !self.may_pass_the_line(key, mode) {
            return Ok(Saved::Conflict(Conflict::new()));
        }
        self.attempt(key, mode, false)
    }

    /// A place in the line of lock file `name`, for a waiter in `mode`.
    pub(super) fn join_the_line(&self, name: &str, mode: Mode) -> Place {
        let hub = self.inner.hub.clone();
        let woken = name.to_owned();
        self.inner
            .hub
            .lines()
            .join(name, mode, move || hub.wake_waiters(&woken))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_goes_first_and_readers_together() {
        let lines = Arc::new(Lines::default());
        assert!(lines.open_to(|| "f".into(), Mode::Write));
        let w = lines.join("f", Mode::Write, || {});
        let r1 = lines.join("f", Mode::Read, || {});
        let r2 = lines.join("f", Mode::Read, || {});
        assert!(w.turn() && !r1.turn() && !r2.turn(), "a writer at the head");
        assert!(
            !lines.open_to(|| "f".into(), Mode::Read),
            "no reader passes it"
        );
        assert!(
            lines.open_to(|| "g".into(), Mode::Write),
            "other files are free"
        );
        drop(w);
        assert!(r1.turn() && r2.turn(), "readers at the head together");
        assert!(lines.open_to(|| "f".into(), Mode::Read));
        assert!(!lines.open_to(|| "f".into(), Mode::Write));
        drop((r1, r2));
        assert!(lines.open_to(|| "f".into(), Mode::Write));
        assert!(lock(&lines.lines).is_empty(), "no line left behind");
    }
}
