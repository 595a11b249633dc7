//! Processes: by group, from `/proc`, and how they ended.

use std::time::Duration;

use rustix::process::{Signal, WaitStatus};

/// The code a shell reports for a process that ended with `status`: its exit code, or 128
/// plus the signal that killed it. None while it has not ended (stopped or continued).
pub(crate) fn shell_code(status: WaitStatus) -> Option<u8> {
    if let Some(code) = status.exit_status() {
        return Some(u8::try_from(code).unwrap_or(1));
    }
    status.terminating_signal().map(killed_by_code)
}

/// The code a shell reports for a process killed by signal `sig`: 128 plus its number.
pub(crate) fn killed_by_code(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(255)
}

/// Whether a process of group `group` other than `except` is running. Zombies do not count: an
/// orphan waits for its new parent to reap it, which some init processes take seconds to do.
pub(crate) fn running_in_group(group: i32, except: Option<i32>) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true; // cannot tell: assume so
    };
    let group = group.to_string();
    let except = except.map(|p| p.to_string());
    entries.filter_map(Result::ok).any(|entry| {
        let name = entry.file_name();
        // Processes only: `/proc/self` and `/proc/thread-self` are the caller under another
        // name, and would make it count itself.
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            return false;
        }
        if except.as_deref().is_some_and(|e| name == e) {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // "pid (comm) state ppid pgrp …": the command name may hold anything, but no ") "
        // follows it.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            return false;
        };
        let mut fields = rest.split(' ');
        let state = fields.next();
        let pgrp = fields.nth(1);
        pgrp == Some(group.as_str()) && state != Some("Z")
    })
}

/// Asks this process's own group to stop, as `run` stops a command: SIGTERM, and SIGCONT for a
/// stopped process to see it. (The caller, in the group, catches SIGTERM.)
pub(crate) fn terminate_group() {
    let group = rustix::process::getpgrp();
    let _ = rustix::process::kill_process_group(group, Signal::TERM);
    let _ = rustix::process::kill_process_group(group, Signal::CONT);
}

/// Waits until no other process of this process's group runs, or until `deadline`; then kills
/// what is left of the group (this process with it).
pub(crate) async fn outlast_group(deadline: tokio::time::Instant) {
    let group = rustix::process::getpgrp();
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let others = || running_in_group(group.as_raw_nonzero().get(), Some(me));
    while others() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if others() {
        let _ = rustix::process::kill_process_group(group, Signal::KILL);
    }
}
