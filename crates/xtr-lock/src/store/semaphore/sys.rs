//! The SysV semaphore calls, in PHP `sysvsem`'s layout: the one module of the crate with
//! `unsafe` code. Every call passes plain integers or a pointer to a local array that lives for
//! the call, and keeps nothing.
//!
//! A lock is a set of three semaphores under one key:
//!
//! - `LOCK` (0): the lock itself, 1 when free, 0 when held;
//! - `USAGE` (1): how many openers use the set (each holds +1 with `SEM_UNDO`);
//! - `GUARD` (2): serializes the check of `USAGE` and the first opener's setting of `LOCK` to 1.
//!
//! Every operation on `LOCK` and `USAGE` carries `SEM_UNDO`, so the kernel gives a dead
//! process's units back: a holder that dies frees the lock at once.
#![allow(unsafe_code)]

use std::io;
use std::time::Duration;

const LOCK: u16 = 0;
const USAGE: u16 = 1;
const GUARD: u16 = 2;
pub(super) const UNDO: i16 = libc::SEM_UNDO as i16;
pub(super) const NOWAIT: i16 = libc::IPC_NOWAIT as i16;

// glibc has `semtimedop`, the libc crate does not declare it for every target.
unsafe extern "C" {
    fn semtimedop(
        semid: libc::c_int,
        sops: *mut libc::sembuf,
        nsops: libc::size_t,
        timeout: *const libc::timespec,
    ) -> libc::c_int;
}

pub(super) fn op(num: u16, change: i16, flags: i16) -> libc::sembuf {
    libc::sembuf {
        sem_num: num,
        sem_op: change,
        sem_flg: flags,
    }
}

/// `semtimedop` on `ops`, waiting at most `wait` (`None`: no wait at all, the ops carry
/// `IPC_NOWAIT`). `Ok(false)` when it would block or the wait ran out; `EINTR` retried.
pub(super) fn apply(id: i32, ops: &mut [libc::sembuf], wait: Option<Duration>) -> io::Result<bool> {
    let timeout = wait.map(|w| libc::timespec {
        tv_sec: libc::time_t::try_from(w.as_secs()).unwrap_or(libc::time_t::MAX),
        // Under 10^9: fits every target's c_long.
        tv_nsec: w.subsec_nanos() as libc::c_long,
    });
    loop {
        let ptr = timeout
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `ops` is a live, exclusively borrowed array of `ops.len()` sembufs and `ptr`
        // is null or points at `timeout`, which outlives the call; the kernel reads both during
        // the call only.
        let rc = unsafe { semtimedop(id, ops.as_mut_ptr(), ops.len(), ptr) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Opens (or creates, mode 0666) the set of `key` and counts this opener in, as PHP's
/// `sem_get` does: under the guard, the first opener sets `LOCK` to 1. While another opener
/// holds the guard (a stopped process can hold it): with `step` `None`, `Ok(None)` at once;
/// otherwise `stop` is asked every `step` whether to give up, and then `Ok(None)`. `Ok(None)`
/// leaves nothing counted in.
pub(super) fn open(
    key: i32,
    step: Option<Duration>,
    stop: &dyn Fn() -> bool,
) -> io::Result<Option<i32>> {
    // SAFETY: semget takes plain integers.
    let id = unsafe { libc::semget(key, 3, 0o666 | libc::IPC_CREAT) };
    if id < 0 {
        return Err(io::Error::last_os_error());
    }
    // Wait for the guard to be 0, take it, and count ourselves in: one atomic operation.
    let flag = if step.is_none() { NOWAIT } else { 0 };
    let mut enter = [
        op(GUARD, 0, flag),
        op(GUARD, 1, UNDO | flag),
        op(USAGE, 1, UNDO | flag),
    ];
    while !apply(id, &mut enter, step)? {
        if step.is_none() || stop() {
            return Ok(None);
        }
    }
    let set_up = (|| {
        if query(id, USAGE, libc::GETVAL)? == 1 {
            // SAFETY: SETVAL's fourth argument is `union semun`, whose `val` member is an int
            // passed by value; an int is passed the same way through the varargs.
            if unsafe { libc::semctl(id, LOCK.into(), libc::SETVAL, 1 as libc::c_int) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    })();
    let mut leave_guard = [op(GUARD, -1, UNDO)];
    let left = apply(id, &mut leave_guard, None);
    if let Err(e) = set_up.and(left.map(|_| ())) {
        leave(id);
        return Err(e);
    }
    Ok(Some(id))
}

/// Takes the lock of set `id`: at once or not at all (`wait` `None`), or waiting at most
/// `wait`. `Ok(false)`: not taken. `EIDRM`/`EINVAL` mean the set was removed (a release):
/// open it again.
pub(super) fn take(id: i32, wait: Option<Duration>) -> io::Result<bool> {
    let flags = if wait.is_some() { UNDO } else { UNDO | NOWAIT };
    apply(id, &mut [op(LOCK, -1, flags)], wait)
}

/// Gives the lock's unit back and counts this opener out, undoing both adjustments: for an
/// acquisition nobody will use (its wait was dropped). Errors are ignored: a removed set has
/// nothing to give back.
pub(super) fn give_back(id: i32) {
    let _ = apply(id, &mut [op(LOCK, 1, UNDO), op(USAGE, -1, UNDO)], None);
}

/// Counts this opener out of set `id` (a try that was refused). A removed set: nothing to do.
pub(super) fn leave(id: i32) {
    let _ = apply(id, &mut [op(USAGE, -1, UNDO)], None);
}

/// Removes set `id`, as PHP's `sem_remove` does: waiters on it get `EIDRM` and open a new one.
pub(super) fn remove(id: i32) -> io::Result<()> {
    // SAFETY: IPC_RMID takes no fourth argument; plain integers.
    if unsafe { libc::semctl(id, 0, libc::IPC_RMID) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The set of `key` if one exists, without creating or joining it.
pub(super) fn existing(key: i32) -> io::Result<Option<i32>> {
    // SAFETY: semget takes plain integers; without IPC_CREAT it creates nothing.
    let id = unsafe { libc::semget(key, 0, 0) };
    if id >= 0 {
        return Ok(Some(id));
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::EIDRM) => Ok(None),
        _ => Err(err),
    }
}

/// `semctl(id, num, cmd)` for a query that takes no fourth argument (GETVAL, GETPID).
pub(super) fn query(id: i32, num: u16, cmd: libc::c_int) -> io::Result<i32> {
    // SAFETY: GETVAL and GETPID take no fourth argument; plain integers.
    let answer = unsafe { libc::semctl(id, num.into(), cmd) };
    if answer < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(answer)
}

/// Whether the lock of set `id` is taken (its semaphore is 0).
pub(super) fn is_taken(id: i32) -> io::Result<bool> {
    Ok(query(id, LOCK, libc::GETVAL)? == 0)
}

/// The pid of the last process that changed the lock of set `id`: its holder while it is taken.
pub(super) fn last_pid(id: i32) -> io::Result<i32> {
    query(id, LOCK, libc::GETPID)
}

/// Whether `err` says the set is gone (removed meanwhile).
pub(super) fn is_removed(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EIDRM) | Some(libc::EINVAL))
}

/// Whether `err` is a refusal to remove a set someone else owns.
pub(super) fn is_not_permitted(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EPERM)
}

/// Makes a new set of `nsems` semaphores (all 0) for `key`, mode 0666: `Ok(None)` when `key`
/// has one already.
pub(super) fn create_exclusive(key: i32, nsems: i32) -> io::Result<Option<i32>> {
    // SAFETY: semget takes plain integers.
    let id = unsafe { libc::semget(key, nsems, 0o666 | libc::IPC_CREAT | libc::IPC_EXCL) };
    if id >= 0 {
        return Ok(Some(id));
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EEXIST) => Ok(None),
        _ => Err(err),
    }
}

/// The last `semop` time of set `id` (0: no `semop` yet, its creator has not set it up).
pub(super) fn last_op_time(id: i32) -> io::Result<i64> {
    let mut ds = std::mem::MaybeUninit::<libc::semid_ds>::zeroed();
    // SAFETY: IPC_STAT's fourth argument is `union semun`, whose `buf` member is a pointer to
    // a `semid_ds`; a pointer is passed the same way through the varargs. `ds` is a live,
    // zeroed local the kernel fills during the call.
    if unsafe { libc::semctl(id, 0, libc::IPC_STAT, ds.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zeroed is a valid `semid_ds` (plain integers), and the kernel filled it.
    let ds = unsafe { ds.assume_init() };
    // `time_t` is `i64` on 64-bit targets, narrower elsewhere.
    #[allow(clippy::useless_conversion)]
    Ok(i64::from(ds.sem_otime))
}
