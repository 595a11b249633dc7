//! Counting semaphores on SysV semaphores, counted natively: a set of two semaphores under
//! [`counting_semaphore_key`], `PERMITS` (the permits free now) and `LIMIT` (the limit its
//! holders use). Taking `count` permits is one atomic `semop`: "`LIMIT` is exactly ours" and
//! `PERMITS -= count` with `SEM_UNDO`, so a holder that dies gives its permits back at once.
//! See `docs/semaphores.md`.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use md5::{Digest as _, Md5};

use super::sys::{self, NOWAIT, UNDO, op};
use super::{CancelOnDrop, SemaphoreStore};
use crate::error::{Error, LostReason, Result};
use crate::key::{Key, Mode};
use crate::mutex::lock;
use crate::permits::Permits;
use crate::store::{Acquired, Conflict, Holding, Saved, Usage};

const PERMITS: u16 = 0;
const LIMIT: u16 = 1;

/// How long a set may stay unset-up (made, but its maker's first `semop` not done) before it is
/// taken for the remains of a maker that died in between, and removed.
const STALE_SETUP: Duration = Duration::from_secs(1);

/// How long a blocked wait stays in the kernel before it looks at the limit and at its
/// cancellation (a release wakes it at once).
const STEP: Duration = Duration::from_millis(50);

/// How often an attempt starts over on a set removed or changed under it before giving up.
const RETRIES: usize = 1000;

/// The SysV key of `resource`'s counting semaphore: the second four bytes of its MD5, read as a
/// native-endian `i32` (the lock of the same name, [`semaphore_key`](super::semaphore_key),
/// uses the first four).
pub fn counting_semaphore_key(resource: &str) -> i32 {
    let digest = Md5::digest(resource.as_bytes());
    i32::from_ne_bytes([digest[4], digest[5], digest[6], digest[7]])
}

/// A holder's permits: the set it took them from, and how many.
#[derive(Debug, Clone, Copy)]
struct HeldPermits {
    key: i32,
    id: i32,
    count: u32,
}

/// A semaphore holder's handle. Dropped while holding (every clone of the key gone), it gives
/// the permits back.
#[derive(Default)]
pub(super) struct PermitsHandle(std::sync::Mutex<Option<HeldPermits>>);

impl Drop for PermitsHandle {
    fn drop(&mut self) {
        if let Some(held) = lock(&self.0).take() {
            give_back(held);
        }
    }
}

/// Gives `held`'s permits back (with `SEM_UNDO`, cancelling the adjustment the kernel would make
/// at exit), unless its set is no longer the key's: whether it did.
fn give_back(held: HeldPermits) -> bool {
    if sys::existing(held.key).ok().flatten() != Some(held.id) {
        return false;
    }
    let back = i16::try_from(held.count).unwrap_or(i16::MAX);
    sys::apply(held.id, &mut [op(PERMITS, back, UNDO)], None).unwrap_or(false)
}

/// Permits a blocking thread took, on their way to the holder's handle: dropped on the way (the
/// wait was dropped), they go back.
struct Taken(Option<HeldPermits>);

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            give_back(held);
        }
    }
}

/// What an attempt found.
enum Outcome {
    Taken(i32),
    Busy,
    /// The set's holders use this limit.
    Mismatch(u32),
    /// Another process is making the set: try again on a thread that may wait for it.
    SettingUp,
}

fn short(n: u32) -> i16 {
    // Limits are at most 1000 (MAX_PERMITS).
    i16::try_from(n).unwrap_or(i16::MAX)
}

/// Opens the key's set, making it with `limit` free permits when there is none: the maker sets
/// both values in its first `semop`, and others wait for one (`sem_otime` set) before they use
/// the set. `Ok(None)`: the set is being made and `may_wait` is false, or `stop` said stop.
fn open(key: i32, limit: u32, may_wait: bool, stop: &dyn Fn() -> bool) -> io::Result<Option<i32>> {
    let mut unset: Option<(i32, Instant)> = None;
    for _ in 0..RETRIES {
        if let Some(id) = sys::create_exclusive(key, 2)? {
            let l = short(limit);
            match sys::apply(id, &mut [op(PERMITS, l, 0), op(LIMIT, l, 0)], None) {
                Ok(_) => return Ok(Some(id)),
                Err(e) if sys::is_removed(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        let Some(id) = sys::existing(key)? else {
            continue;
        };
        match sys::last_op_time(id) {
            Ok(0) => {}
            Ok(_) => return Ok(Some(id)),
            Err(e) if sys::is_removed(&e) => continue,
            Err(e) => return Err(e),
        }
        if !may_wait || stop() {
            return Ok(None);
        }
        match unset {
            Some((seen, since)) if seen == id && since.elapsed() > STALE_SETUP => {
                // Its maker died between making it and setting it up.
                let _ = sys::remove(id);
                unset = None;
            }
            Some((seen, _)) if seen == id => std::thread::sleep(Duration::from_millis(1)),
            _ => unset = Some((id, Instant::now())),
        }
    }
    Err(io::Error::other(
        "the counting set was removed over and over while being opened",
    ))
}

/// `LIMIT` is exactly `limit` (take it, check for zero, put it back), and `count` permits taken
/// with `SEM_UNDO`: one atomic `semop`.
fn take_ops(p: Permits, nowait: i16) -> [libc::sembuf; 4] {
    let l = short(p.limit());
    [
        op(LIMIT, -l, nowait),
        op(LIMIT, 0, nowait),
        op(LIMIT, l, 0),
        op(PERMITS, -short(p.count()), UNDO | nowait),
    ]
}

/// Changes the limit from `stored` to ours while nobody holds (`PERMITS` and `LIMIT` both
/// exactly `stored`) and takes the permits, in one atomic `semop`.
fn change_ops(stored: u32, p: Permits) -> [libc::sembuf; 7] {
    let (s, l) = (short(stored), short(p.limit()));
    [
        op(PERMITS, -s, NOWAIT),
        op(PERMITS, 0, NOWAIT),
        op(PERMITS, l, 0),
        op(LIMIT, -s, NOWAIT),
        op(LIMIT, 0, NOWAIT),
        op(LIMIT, l, 0),
        op(PERMITS, -short(p.count()), UNDO | NOWAIT),
    ]
}

/// Takes the permits on set `id`: at once, or waiting (in steps, asking `stop`).
fn take(id: i32, p: Permits, wait: bool, stop: &dyn Fn() -> bool) -> io::Result<Outcome> {
    for _ in 0..RETRIES {
        let nowait = if wait { 0 } else { NOWAIT };
        if sys::apply(id, &mut take_ops(p, nowait), wait.then_some(STEP))? {
            return Ok(Outcome::Taken(id));
        }
        let stored = u32::try_from(sys::query(id, LIMIT, libc::GETVAL)?).unwrap_or(0);
        if stored != p.limit() {
            let free = u32::try_from(sys::query(id, PERMITS, libc::GETVAL)?).unwrap_or(0);
            if free < stored {
                return Ok(Outcome::Mismatch(stored));
            }
            if sys::apply(id, &mut change_ops(stored, p), None)? {
                return Ok(Outcome::Taken(id));
            }
            continue; // someone took or changed it meanwhile: look again
        }
        if !wait || stop() {
            return Ok(Outcome::Busy);
        }
    }
    Ok(Outcome::Busy)
}

/// One attempt: open the key's set and take the permits; a set removed under it is opened again.
fn attempt(
    key: i32,
    p: Permits,
    may_wait: bool,
    wait: bool,
    stop: &dyn Fn() -> bool,
) -> io::Result<Outcome> {
    for _ in 0..RETRIES {
        let Some(id) = open(key, p.limit(), may_wait, stop)? else {
            return Ok(if may_wait {
                Outcome::Busy
            } else {
                Outcome::SettingUp
            });
        };
        match take(id, p, wait, stop) {
            Err(e) if sys::is_removed(&e) => {}
            other => return other,
        }
    }
    Err(io::Error::other(
        "the counting set was removed over and over",
    ))
}

impl SemaphoreStore {
    fn counting_key(&self, resource: &str) -> Result<i32> {
        let id = counting_semaphore_key(resource);
        if id == libc::IPC_PRIVATE {
            return Err(Error::invalid_argument(
                "this semaphore's SysV key is 0 (IPC_PRIVATE), which no two processes can \
                 share: rename it",
            )
            .with_resource(resource)
            .with_store(self));
        }
        Ok(id)
    }

    /// Takes the holder's permits, at once or waiting (a blocking thread then waits in the
    /// kernel, in steps of 50 ms, and stops when the wait is dropped, giving back what it took).
    pub(super) async fn sem_take(&self, key: &Key, p: Permits, wait: bool) -> Result<Saved> {
        let handle = key.handle::<PermitsHandle>(self.owner);
        let holds = lock(&handle.0).is_some();
        if holds && self.sem_check(key)?.is_held() {
            return Ok(Saved::Acquired(Acquired::new()));
        }
        let sem_key = self.counting_key(key.resource())?;
        let fail = |e: io::Error| self.error(key.resource(), "counting semaphore", e);
        let mut outcome = Outcome::SettingUp;
        if !wait {
            // A try needs no thread unless another process is making the set.
            outcome = attempt(sem_key, p, false, false, &|| false).map_err(fail)?;
        }
        if matches!(outcome, Outcome::SettingUp) {
            let cancel = Arc::new(AtomicBool::new(false));
            let _cancel_on_drop = CancelOnDrop(cancel.clone());
            let task = tokio::task::spawn_blocking(move || {
                let stop = || cancel.load(Ordering::Acquire);
                let outcome = attempt(sem_key, p, true, wait, &stop);
                // Permits taken after the wait was dropped go back with the guard.
                let guard = match &outcome {
                    Ok(Outcome::Taken(id)) => Taken(Some(HeldPermits {
                        key: sem_key,
                        id: *id,
                        count: p.count(),
                    })),
                    _ => Taken(None),
                };
                (outcome, guard)
            });
            let (found, mut guard) = task.await.map_err(|join| {
                Error::storage("a semaphore's thread ended abnormally")
                    .with_resource(key.resource())
                    .with_store(self)
                    .with_source(join)
            })?;
            guard.0.take();
            outcome = found.map_err(fail)?;
        }
        match outcome {
            Outcome::Taken(id) => {
                let held = HeldPermits {
                    key: sem_key,
                    id,
                    count: p.count(),
                };
                *lock(&handle.0) = Some(held);
                // The permits belong to this process's undo state: they cannot travel.
                key.mark_unserializable();
                Ok(Saved::Acquired(Acquired::new()))
            }
            Outcome::Mismatch(stored) => {
                Err(p.limit_mismatch(key.resource(), stored).with_store(self))
            }
            Outcome::Busy | Outcome::SettingUp => Ok(Saved::Conflict(Conflict::new())),
        }
    }

    /// Whether the holder's set is still the one its key names (an `ipcrm` removes it, and the
    /// permits with it).
    pub(super) fn sem_check(&self, key: &Key) -> Result<Holding> {
        let Some(handle) = key.existing_handle::<PermitsHandle>(self.owner) else {
            return Ok(Holding::NotHeld(LostReason::Removed));
        };
        let mut slot = lock(&handle.0);
        let Some(held) = *slot else {
            return Ok(Holding::NotHeld(LostReason::Removed));
        };
        let current = sys::existing(held.key)
            .map_err(|e| self.error(key.resource(), "semaphore lookup", e))?;
        if current == Some(held.id) {
            Ok(Holding::Held(Mode::Write))
        } else {
            *slot = None;
            Ok(Holding::NotHeld(LostReason::Removed))
        }
    }

    /// Gives the holder's permits back: whether it held them on the key's current set.
    pub(super) fn sem_delete(&self, key: &Key) -> bool {
        let Some(handle) = key.existing_handle::<PermitsHandle>(self.owner) else {
            return false;
        };
        let held = lock(&handle.0).take();
        held.is_some_and(give_back)
    }

    /// Permits held now (`LIMIT − PERMITS`) and the limit while any is held. Who holds them
    /// the kernel does not tell (only the last process to change the set): no holders.
    pub(super) fn sem_usage(&self, key: &Key) -> Result<Usage> {
        let sem_key = self.counting_key(key.resource())?;
        let fail = |e: io::Error| self.error(key.resource(), "counting semaphore state", e);
        let Some(id) = sys::existing(sem_key).map_err(fail)? else {
            return Ok(Usage::default());
        };
        let values = sys::query(id, LIMIT, libc::GETVAL)
            .and_then(|limit| Ok((limit, sys::query(id, PERMITS, libc::GETVAL)?)));
        let (limit, free) = match values {
            Ok(v) => v,
            Err(e) if sys::is_removed(&e) => return Ok(Usage::default()),
            Err(e) => return Err(fail(e)),
        };
        let used = u32::try_from(limit.saturating_sub(free)).unwrap_or(0);
        Ok(Usage {
            used,
            limit: u32::try_from(limit).ok().filter(|_| used > 0),
            holders: Vec::new(),
        })
    }
}
