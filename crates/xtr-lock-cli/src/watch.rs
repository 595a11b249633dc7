//! What the watcher of `run`'s command's group (see `sentinel`) runs instead of an async
//! runtime: plain system calls, so that its start, this executable's again, costs no more than
//! the start itself. It waits in `poll(2)` on descriptors: a pidfd of `xtr-lock` (readable once
//! it ended) and the sentinel's pipe. The signals sent to the command's group for the command
//! are blocked rather than caught: they stay pending, and end nothing. Only for a process that
//! starts nothing: a blocked mask is inherited by a child, and survives its `exec` (the standard
//! library does not reset it; the command's supervisor, which starts the command, catches them
//! instead, see `trampoline`; the forked watcher forks its sentinel before it blocks them, see
//! `helper`).

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal as NixSignal};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal};

use crate::procs;

/// How often a watcher whose parent has no pidfd (a kernel before 5.3) looks for its death.
const PARENT_POLL: Duration = Duration::from_millis(50);

/// Blocks the signals, other than SIGKILL and SIGSTOP, that would end the watcher in the
/// command's group and that are sent to the group for the command (SIGTERM and SIGHUP
/// forwarded by `run`, SIGINT and SIGQUIT from the terminal, `kill -USR1 -- -PGID` to rotate
/// its logs): the watcher lives on. Never in a process that starts another: it inherits the
/// mask.
pub(crate) fn block_the_commands_signals() -> std::io::Result<()> {
    let mut set = SigSet::empty();
    for sig in [
        NixSignal::SIGTERM,
        NixSignal::SIGINT,
        NixSignal::SIGHUP,
        NixSignal::SIGQUIT,
        NixSignal::SIGUSR1,
        NixSignal::SIGUSR2,
        NixSignal::SIGALRM,
    ] {
        set.add(sig);
    }
    set.thread_block().map_err(std::io::Error::from)
}

/// The watcher's parent, `xtr-lock`, watched for its end.
pub(crate) struct Parent {
    pid: i32,
    /// Readable once it ended; `None` where the kernel has no pidfds (then polled).
    fd: Option<OwnedFd>,
}

impl Parent {
    /// `pid`, which must be this process's parent to be watched: [`Parent::alive`] is false
    /// at once otherwise.
    pub(crate) fn open(pid: i32) -> Parent {
        let fd = Pid::from_raw(pid)
            .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
        Parent { pid, fd }
    }

    /// Whether it still runs: it is still this process's parent (once it dies, another
    /// process adopts this one), and its pidfd, opened while it was, has not reported its end.
    pub(crate) fn alive(&self) -> bool {
        let reported = self.fd.as_ref().is_some_and(readable);
        !reported && crate::trampoline::parent_is(self.pid)
    }

    /// Its pidfd, to wait on, and how long a wait may last without it.
    fn poll_fd(&self) -> (Option<PollFd<'_>>, Option<Duration>) {
        match &self.fd {
            Some(fd) => (Some(PollFd::new(fd, PollFlags::IN)), None),
            None => (None, Some(PARENT_POLL)),
        }
    }
}

/// Waits until `fds` (with the parent's pidfd, while `parent` is watched) report something,
/// or `timeout` passes; returns the revents of `fds`, in their order. An interrupted or
/// failed wait returns early: callers look again at what they wait for.
pub(crate) fn wait(
    parent: Option<&Parent>,
    fds: &[(&dyn AsFd, PollFlags)],
    timeout: Option<Duration>,
) -> Vec<PollFlags> {
    let (parent_fd, parent_timeout) = parent.map_or((None, None), Parent::poll_fd);
    let mut polled: Vec<PollFd<'_>> = fds
        .iter()
        .map(|(fd, events)| PollFd::new(fd, *events))
        .collect();
    polled.extend(parent_fd);
    let timeout = match (timeout, parent_timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let timespec = timeout.and_then(|t| Timespec::try_from(t).ok());
    if rustix::event::poll(&mut polled, timespec.as_ref()).is_err() {
        // EINTR (a stop and continue) or EAGAIN: look again, not at once in a loop.
        std::thread::sleep(Duration::from_millis(1));
    }
    polled.iter().take(fds.len()).map(PollFd::revents).collect()
}

/// Whether `fd` is readable (a pidfd: its process ended) without waiting.
fn readable(fd: &impl AsFd) -> bool {
    let mut polled = [PollFd::new(fd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut polled, Some(&zero)).is_ok_and(|n| n > 0)
}

/// Waits until no other process of this process's group runs, or until `deadline`; then kills
/// what is left of the group (this process with it).
pub(crate) fn outlast_group(deadline: Instant) {
    let group = rustix::process::getpgrp();
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let others = || procs::running_in_group(group.as_raw_nonzero().get(), Some(me));
    while others() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if others() {
        let _ = rustix::process::kill_process_group(group, Signal::KILL);
    }
}
