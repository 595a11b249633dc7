//! The in-memory store's lock entries: who holds one resource's lock, and who waits for it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::queue::{Queue, Want};
use crate::error::LostReason;
use crate::key::{Key, Mode};
use crate::store::{HolderInfo, HolderRecord, Holding};

#[derive(Default)]
pub(super) struct Entry {
    pub(super) writer: Option<Writer>,
    /// Reader token → expiry.
    pub(super) readers: HashMap<String, Option<Instant>>,
    /// Holder token → its metadata record, for every token above.
    pub(super) records: HashMap<String, HolderRecord>,
    /// Who waits, in order.
    pub(super) queue: Queue,
}

pub(super) struct Writer {
    pub(super) token: String,
    pub(super) fence: u64,
    pub(super) expires: Option<Instant>,
}

impl Entry {
    pub(super) fn is_empty(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty() && self.queue.is_empty()
    }

    /// Drops expired holders; returns whether any went.
    pub(super) fn prune(&mut self, now: Instant) -> bool {
        let mut changed = false;
        if self
            .writer
            .as_ref()
            .is_some_and(|w| w.expires.is_some_and(|e| e <= now))
        {
            self.writer = None;
            changed = true;
        }
        let before = self.readers.len();
        self.readers.retain(|_, e| e.is_none_or(|e| e > now));
        let changed = changed || self.readers.len() != before;
        if changed {
            self.forget_gone();
        }
        changed
    }

    /// Drops the records of tokens that hold nothing any more.
    pub(super) fn forget_gone(&mut self) {
        let writer = self.writer.as_ref().map(|w| w.token.clone());
        let readers = &self.readers;
        self.records
            .retain(|t, _| writer.as_deref() == Some(t.as_str()) || readers.contains_key(t));
    }

    /// Records `key`'s acquisition (a new one), or its new metadata (a re-save).
    pub(super) fn record(&mut self, token: &str, key: &Key, fence: Option<u64>) {
        match self.records.get_mut(token) {
            Some(r) => r.meta = key.meta().map(|m| m.to_vec()),
            None => {
                let record = HolderRecord::now(key).with_fencing_token(fence);
                self.records.insert(token.to_owned(), record);
            }
        }
    }

    /// Who holds at `now`, with their records.
    pub(super) fn holders(&self, now: Instant) -> Vec<HolderInfo> {
        let pid = Some(std::process::id());
        let left = |e: Option<Instant>| e.map(|e| e.saturating_duration_since(now));
        let alive = |e: Option<Instant>| e.is_none_or(|e| e > now);
        let info = |mode, token: &str, expires| {
            HolderInfo::new(mode, pid, left(expires))
                .with_token(token)
                .with_record(self.records.get(token).cloned())
        };
        let mut out: Vec<HolderInfo> = self
            .writer
            .iter()
            .filter(|w| alive(w.expires))
            .map(|w| info(Mode::Write, &w.token, w.expires))
            .collect();
        out.extend(
            self.readers
                .iter()
                .filter(|(_, e)| alive(**e))
                .map(|(t, e)| info(Mode::Read, t, *e)),
        );
        out.extend(self.queue.tickets().iter().map(|t| t.info()));
        out
    }

    /// The mode `token` holds in at `now` (expired entries hold nothing).
    pub(super) fn mode_of(&self, token: &str, now: Instant) -> Option<Mode> {
        let alive = |e: Option<Instant>| e.is_none_or(|e| e > now);
        if self
            .writer
            .as_ref()
            .is_some_and(|w| w.token == token && alive(w.expires))
        {
            return Some(Mode::Write);
        }
        self.readers
            .get(token)
            .filter(|e| alive(**e))
            .map(|_| Mode::Read)
    }

    /// Whether `token` has an entry, live or not.
    pub(super) fn has_entry(&self, token: &str) -> bool {
        self.writer.as_ref().is_some_and(|w| w.token == token) || self.readers.contains_key(token)
    }

    /// Whether anyone but `token` holds at `now`.
    pub(super) fn others_hold(&self, token: &str, now: Instant) -> bool {
        let alive = |e: Option<Instant>| e.is_none_or(|e| e > now);
        self.writer
            .as_ref()
            .is_some_and(|w| w.token != token && alive(w.expires))
            || self
                .readers
                .iter()
                .any(|(t, e)| t.as_str() != token && alive(*e))
    }

    /// What `token` holds, or why not.
    pub(super) fn holding(&self, token: &str, now: Instant) -> Holding {
        match self.mode_of(token, now) {
            Some(mode) => Holding::Held(mode),
            None if self.has_entry(token) => Holding::NotHeld(LostReason::Expired),
            None if self.others_hold(token, now) => Holding::NotHeld(LostReason::TakenOver),
            None => Holding::NotHeld(LostReason::Removed),
        }
    }

    /// When the earliest holder other than `token` expires, if every one of them expires.
    pub(super) fn retry_after(&self, token: &str, now: Instant) -> Option<Duration> {
        let mut earliest: Option<Instant> = None;
        let others = self
            .writer
            .iter()
            .filter(|w| w.token != token)
            .map(|w| w.expires)
            .chain(
                self.readers
                    .iter()
                    .filter(|(t, _)| t.as_str() != token)
                    .map(|(_, e)| *e),
            );
        for e in others {
            let e = e?;
            earliest = Some(earliest.map_or(e, |x| x.min(e)));
        }
        earliest.map(|e| e.saturating_duration_since(now))
    }
}

impl Entry {
    /// Whether `token`, holding nothing here, may take the lock in `mode` past the waiters: a
    /// writer only with nobody waiting before it, a reader only behind readers.
    pub(super) fn admits(&self, token: &str, mode: Mode) -> bool {
        let ahead = self.queue.ahead(token);
        match mode {
            Mode::Write => ahead.is_empty(),
            Mode::Read => ahead.iter().all(|t| t.want == Want::Read),
        }
    }

    /// Whether anyone holds.
    fn held(&self, now: Instant) -> bool {
        self.others_hold("", now)
    }

    /// Wakes the waiters whose turn it is: the first writer when nobody holds, the readers at
    /// the head while no writer holds (a waiter of unknown mode when no writer holds, as it may
    /// read). A waiter that already reads and waits to write is woken when it is the only holder
    /// left, wherever it stands (it holds, so nobody behind it could get in before it anyway).
    pub(super) fn serve(&self, now: Instant) {
        let alive = |e: Option<Instant>| e.is_none_or(|e| e > now);
        let writes = self.writer.as_ref().is_some_and(|w| alive(w.expires));
        for t in self.queue.tickets() {
            if self.mode_of(&t.token, now).is_some() {
                if !self.others_hold(&t.token, now) {
                    t.wake();
                }
                break;
            }
            match t.want {
                Want::Read if !writes => t.wake(),
                Want::Unknown if !writes => {
                    t.wake();
                    break;
                }
                Want::Write if !self.held(now) => {
                    t.wake();
                    break;
                }
                _ => break,
            }
        }
        for t in self.queue.tickets() {
            if self.mode_of(&t.token, now).is_some() && !self.others_hold(&t.token, now) {
                t.wake();
            }
        }
    }

    /// A save of `token` in `mode` was refused: the queue learns what it waits for, and the
    /// waiters behind it are served again if that changed.
    pub(super) fn refused(&mut self, token: &str, mode: Mode, now: Instant) {
        let want = match mode {
            Mode::Read => Want::Read,
            Mode::Write => Want::Write,
        };
        if self.queue.note(token, want) {
            self.serve(now);
        }
    }
}
