//! The job's sentinel: how `run` on flock stops its command when `xtr-lock`'s whole process
//! group is killed (`kill -9 -- -PGID`, `timeout -s KILL`, a service manager killing the job),
//! while a kill of `xtr-lock` alone leaves the command running with the lock, both as under
//! flock(1), whose command shares flock's process group.
//!
//! `run`'s command has a process group of its own, so that `run` can signal it as a group
//! without signalling whoever started `run`; SIGKILL to `xtr-lock`'s group therefore missed it,
//! and on flock, where the command holds the lock's descriptor, it ran on holding the lock. A
//! process outside the command's group must notice the death of `xtr-lock`'s group, and only
//! that: `xtr-lock` itself cannot (SIGKILL), and a parent-death signal cannot tell `kill -9 PID`
//! from `kill -9 -PGID` when `xtr-lock` is alone in its group (`setsid`). So a second process
//! stays in `xtr-lock`'s group: this executable again (`__sentinel`), with every signal but
//! SIGKILL (and SIGSTOP) blocked, holding the write end of a private FIFO whose read end the
//! command's supervisor watches (`trampoline`, `group=` option). Killing the group kills the
//! sentinel; the supervisor sees the FIFO's end and stops the command's group as on a lost
//! lock (SIGTERM, then SIGKILL after `--kill-after`); the lock file's descriptors close with
//! it. The sentinel ends by itself once nobody reads the FIFO (`xtr-lock` and the supervisor
//! gone). It goes by path, as the lease file: a descriptor cannot be handed to the supervisor
//! without `unsafe`, which this workspace forbids.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use rustix::event::{PollFd, PollFlags};
use rustix::fs::{FileType, Mode};
use rustix::io::Errno;
use tokio::net::unix::pipe::Receiver;

use crate::{exit, output, trampoline};

/// The first argument that selects this mode (never a subcommand a user types): `__sentinel
/// DEV:INO`, with the write end of that FIFO as stdout.
pub(crate) const ARG: &str = "__sentinel";

/// `run`'s side: the sentinel started in `xtr-lock`'s process group, the FIFO it holds, and
/// `xtr-lock`'s own reading end of it (the sentinel lives while `xtr-lock` or the supervisor
/// reads). Dropped once the command ended: the sentinel then ends too.
#[derive(Debug)]
pub(crate) struct Sentinel {
    path: PathBuf,
    reader: Option<File>,
    process: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    /// Starts the sentinel in this process's group.
    pub(crate) fn start() -> std::io::Result<Sentinel> {
        let dir = tempfile::Builder::new().prefix("xtr-lock-job-").tempdir()?;
        let path = dir.path().join("group");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )?;
        // A reader first, so that opening the write end does not wait for one.
        let reader = OpenOptions::new()
            .read(true)
            .custom_flags(nonblocking())
            .open(&path)?;
        let writer = OpenOptions::new().write(true).open(&path)?;
        let process = Command::new(trampoline::SELF_EXE)
            .arg0("xtr-lock")
            .arg(ARG)
            .arg(identity(&writer)?)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Sentinel {
            path,
            reader: Some(reader),
            process,
            _dir: dir,
        })
    }

    /// The FIFO, for the supervisor.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        // With no reader left (the supervisor ended with the command), the sentinel ends. Reaped
        // here if it already did; otherwise when `xtr-lock` exits, moments later.
        self.reader.take();
        let _ = self.process.try_wait();
    }
}

/// The device and inode of an open file, as the sentinel's argument.
fn identity(file: &impl std::os::fd::AsFd) -> std::io::Result<std::ffi::OsString> {
    let st = rustix::fs::fstat(file)?;
    Ok(format!("{}:{}", st.st_dev, st.st_ino).into())
}

/// `O_NONBLOCK`, as `OpenOptions::custom_flags` takes it.
fn nonblocking() -> i32 {
    i32::try_from(rustix::fs::OFlags::NONBLOCK.bits()).unwrap_or(0)
}

/// The supervisor's side: the FIFO opened for reading, its name removed. Within a runtime.
pub(crate) fn watch(path: &Path) -> std::io::Result<Receiver> {
    let fifo = tokio::net::unix::pipe::OpenOptions::new().open_receiver(path)?;
    let _ = std::fs::remove_file(path);
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(fifo)
}

/// Whether the sentinel is gone (the FIFO has no writer left): `xtr-lock`'s group was killed.
pub(crate) fn gone(fifo: &Receiver) -> bool {
    // Nothing is ever written: a read ends (0 bytes) once no writer is left, else would block.
    matches!(fifo.try_read(&mut [0u8; 1]), Ok(0))
}

/// Runs the sentinel if this process was started as one; `None` otherwise.
pub(crate) fn run_if_asked() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != ARG {
        return None;
    }
    let stdout = std::io::stdout();
    let fifo = stdout.as_fd();
    // Its stdout is the FIFO it was told of: started by `run`, not typed. (By identity, not by
    // path: the supervisor may have removed the name already.)
    let told = args.next();
    let is_it = rustix::fs::fstat(fifo).is_ok_and(|held| {
        FileType::from_raw_mode(held.st_mode) == FileType::Fifo
            && told.is_some_and(|told| identity(&fifo).is_ok_and(|id| id == told))
    });
    if !is_it {
        output::error_line(&format!("{ARG} is for xtr-lock run's own use"));
        return Some(ExitCode::from(exit::ERROR));
    }
    // It dies when `run` does of a signal sent to the group: the signals `run` survives (it
    // forwards SIGINT, SIGTERM and SIGHUP to the command and waits for it; a pipe or job
    // control signal) are blocked, the ones that kill `run` (SIGQUIT, SIGUSR1, …, SIGKILL) are
    // not.
    let mut blocked = SigSet::empty();
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGPIPE,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        blocked.add(sig);
    }
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None);
    loop {
        // No events asked: the write end of a FIFO reports an error once no reader is left.
        let mut fds = [PollFd::new(&fifo, PollFlags::empty())];
        match rustix::event::poll(&mut fds, None) {
            Ok(_) if !fds[0].revents().is_empty() => return Some(ExitCode::SUCCESS),
            Ok(_) | Err(Errno::INTR) => {}
            Err(_) => return Some(ExitCode::from(exit::ERROR)),
        }
    }
}
