//! The terminal, for a command in its own process group: when `xtr-lock` is the terminal's
//! foreground job, the command gets the terminal (so it can read it, and Ctrl-C and Ctrl-Z reach
//! it), as a shell gives it to a job; a stopped command stops `xtr-lock`'s job too, so the shell
//! takes over; and the terminal comes back to `xtr-lock`'s group when the command ends.
//!
//! Without this, a command in another process group than the terminal's foreground one is
//! stopped (SIGTTIN) the moment it reads the terminal.

use std::os::fd::{AsFd, BorrowedFd};

use rustix::process::{Pid, Signal};

/// The terminal handed to the command, while it is.
pub(super) struct Terminal {
    fd: BorrowedFd<'static>,
    /// `xtr-lock`'s process group, which had the terminal.
    ours: Pid,
    command: Pid,
}

/// The first of stdin, stdout and stderr that is a terminal whose foreground process group is
/// ours, if any.
fn foreground_terminal() -> Option<BorrowedFd<'static>> {
    let ours = rustix::process::getpgrp();
    [
        rustix::stdio::stdin(),
        rustix::stdio::stdout(),
        rustix::stdio::stderr(),
    ]
    .into_iter()
    .find(|fd| rustix::termios::isatty(fd) && rustix::termios::tcgetpgrp(fd).ok() == Some(ours))
}

impl Terminal {
    /// Gives the terminal to the process group `command` if `xtr-lock` is its foreground job.
    pub(super) fn hand_to(command: Pid) -> Option<Terminal> {
        let fd = foreground_terminal()?;
        let ours = rustix::process::getpgrp();
        rustix::termios::tcsetpgrp(fd, command).ok()?;
        // A command that read the terminal before it was its own was stopped for it: go on.
        let _ = rustix::process::kill_process_group(command, Signal::CONT);
        Some(Terminal { fd, ours, command })
    }

    /// The command stopped (Ctrl-Z): take the terminal back and stop our own job, as the
    /// terminal would have stopped it, so the shell takes over. When continued (`fg`, `bg`),
    /// give the terminal back if we have it again, and continue the command.
    pub(super) fn relay_stop(&self) {
        self.take_back();
        let _ = rustix::process::kill_process_group(self.ours, Signal::TSTP);
        // Here again: continued.
        if rustix::termios::tcgetpgrp(self.fd).ok() == Some(self.ours) {
            let _ = rustix::termios::tcsetpgrp(self.fd, self.command);
        }
        let _ = rustix::process::kill_process_group(self.command, Signal::CONT);
    }

    /// Takes the terminal back for `xtr-lock`'s group, from the background: SIGTTOU is blocked
    /// meanwhile, as shells do, or the kernel would stop us for asking.
    pub(super) fn take_back(&self) {
        use nix::sys::signal::{SigSet, SigmaskHow, Signal as NixSignal, pthread_sigmask};
        let mut ttou = SigSet::empty();
        ttou.add(NixSignal::SIGTTOU);
        let mut before = SigSet::empty();
        let blocked = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut before));
        let _ = rustix::termios::tcsetpgrp(self.fd.as_fd(), self.ours);
        if blocked.is_ok() {
            let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.take_back();
    }
}
