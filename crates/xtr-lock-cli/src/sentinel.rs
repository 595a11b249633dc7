//! The job's sentinel and its watcher: how `run` on flock stops its command when `xtr-lock`'s
//! whole process group is killed (`kill -9 -- -PGID`, `timeout -s KILL`, a service manager
//! killing the job), while a kill of `xtr-lock` alone leaves the command running with the lock,
//! both as under flock(1), whose command shares flock's process group.
//!
//! `run`'s command has a process group of its own, so that `run` can signal it as a group
//! without signalling whoever started `run`; SIGKILL to `xtr-lock`'s group therefore missed it,
//! and on flock, where the command holds the lock's descriptor, it ran on holding the lock. A
//! process outside `xtr-lock`'s group must notice the death of that group, and only that:
//! `xtr-lock` itself cannot (SIGKILL), and its death alone cannot tell `kill -9 PID` from
//! `kill -9 -PGID` when `xtr-lock` is alone in its group (`setsid`). So:
//!
//! - the sentinel stays in `xtr-lock`'s group, reading a pipe that nobody writes to, so it dies
//!   with the group and ends by itself once the pipe has no writer left;
//! - the watcher leads the command's process group (the command is started into it, still as
//!   `xtr-lock`'s child) and holds the pipe's only write end, which reports an error once the
//!   sentinel is gone.
//!
//! Both are forked, not started: the watcher is the helper `run` forked at its start (see
//! `helper`), and forks the sentinel before it leaves `xtr-lock`'s group, then tells `run` it
//! leads its own; the command starts after that. Where there is no helper (a later turn of
//! `--standby`), the sentinel is `/bin/cat` (this executable again, `__sentinel`, where there
//! is none) and the watcher this executable again (`__watch`, the pipe as its stdout). A pidfd of `xtr-lock`
//!   tells it when `xtr-lock` dies; it waits on both in `poll(2)`, with no async runtime (see
//!   `watch`). Once both are gone, it stops the command's group as on a lost lock (SIGTERM,
//!   then SIGKILL after `--kill-after`); the lock file's descriptors close with it. With only `xtr-lock` gone, it waits for the command's group to
//!   end, and then ends (and the sentinel with it). `xtr-lock` kills it once the command ended.
//!
//! A signal that `xtr-lock` catches and forwards to the command (SIGTERM or a hangup sent to the
//! group) may kill the sentinel: with `xtr-lock` alive, that stops nothing more, the command
//! stops as it decides. The watcher blocks the signals sent to the command's group that would
//! end it (but SIGKILL). Started again as this executable, it is started just before the
//! command, which does not wait for it to be ready: its start runs beside the command's, off its
//! way. A group killed before the watcher is ready is seen once it is: the pipe's error and the
//! parent's death stay for it to find. (A signal sent to the command's group meanwhile ends it:
//! the run goes on, its group unwatched.) Forked, it is ready before the command starts.

use std::ffi::OsString;
use std::io::{PipeReader, Read};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use rustix::event::PollFlags;
use rustix::fs::FileType;
use rustix::process::Pid;

use crate::{exit, output, procs, trampoline, watch};

/// The first argument of the sentinel where there is no `/bin/cat` (never a subcommand a user
/// types): `__sentinel DEV:INO`, with that pipe as stdin.
pub(crate) const ARG: &str = "__sentinel";

/// The first argument of the watcher: `__watch PARENT GRACE_MS DEV:INO [json]`, with that pipe,
/// the sentinel's, as stdout.
pub(crate) const WATCH: &str = "__watch";

/// The sentinel where the machine has it: it only waits for the end of its stdin, and starts
/// faster than this executable.
const CAT: &str = "/bin/cat";

/// How often the watcher looks for the command's group once `xtr-lock` died alone.
const ORPHAN_POLL: Duration = Duration::from_millis(100);

/// `run`'s side: the sentinel, started in `xtr-lock`'s process group, and the watcher, leading
/// the group the command is to be started into. Dropped once the command ended: the watcher is
/// killed, and the sentinel ends with it.
#[derive(Debug)]
pub(crate) enum Sentinel {
    /// Both started as programs: this executable as the watcher, `cat` as the sentinel.
    Started {
        sentinel: std::process::Child,
        watcher: std::process::Child,
        group: Pid,
    },
    /// The helper forked at the start as the watcher (see `helper`), which forked the
    /// sentinel: its child, not this process's.
    Forked { watcher: Pid },
}

impl Sentinel {
    /// Starts the sentinel in this process's group and its watcher in a new group, which stops
    /// after `grace` once both the sentinel and this process are gone: the helper forked at the
    /// start where there is one, else this executable started again.
    pub(crate) fn start(grace: Duration) -> std::io::Result<Sentinel> {
        match crate::helper::take().map(|helper| helper.watch(grace)) {
            Some(Ok(watcher)) => Ok(Sentinel::Forked { watcher }),
            // No helper left (a later turn of `--standby`), or it died: as before it existed.
            _ => Sentinel::spawn(grace),
        }
    }

    fn spawn(grace: Duration) -> std::io::Result<Sentinel> {
        let (reader, writer) = std::io::pipe()?;
        let mut sentinel = spawn_sentinel(reader)?;
        // The pipe's only write end: the command, started later, does not inherit it.
        let watcher = Command::new(trampoline::SELF_EXE)
            .arg0("xtr-lock")
            .arg(WATCH)
            .arg(rustix::process::getpid().as_raw_nonzero().to_string())
            .arg(grace.as_millis().to_string())
            .arg(identity(&writer)?)
            .args(output::json().then_some(trampoline::JSON))
            .stdin(Stdio::null())
            .stdout(writer)
            .process_group(0)
            .spawn();
        let watcher = match watcher {
            Ok(watcher) => watcher,
            Err(e) => {
                // Its pipe has no writer left: the sentinel ends.
                let _ = sentinel.try_wait();
                return Err(e);
            }
        };
        let group = Pid::from_raw(watcher.id() as i32)
            .ok_or_else(|| std::io::Error::other("the watcher has no pid"))?;
        Ok(Sentinel::Started {
            sentinel,
            watcher,
            group,
        })
    }

    /// The process group the command goes into: the watcher's pid, which `run` leaves out
    /// where it looks for what of the command is left.
    pub(crate) fn group(&self) -> Pid {
        match self {
            Sentinel::Started { group, .. } => *group,
            Sentinel::Forked { watcher } => *watcher,
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        // The command ended: the watcher has nothing left to watch. With it gone, the
        // sentinel's pipe has no writer left, and the sentinel ends. Both are reaped here if
        // they already ended; otherwise when `xtr-lock` exits, moments later (a forked
        // sentinel by whoever adopts it).
        match self {
            Sentinel::Started {
                sentinel, watcher, ..
            } => {
                let _ = watcher.kill();
                let _ = watcher.try_wait();
                let _ = sentinel.try_wait();
            }
            Sentinel::Forked { watcher } => {
                let _ = rustix::process::kill_process(*watcher, rustix::process::Signal::KILL);
                let _ =
                    rustix::process::waitpid(Some(*watcher), rustix::process::WaitOptions::NOHANG);
            }
        }
    }
}

/// The sentinel, reading `reader`, in this process's group.
fn spawn_sentinel(reader: PipeReader) -> std::io::Result<std::process::Child> {
    let mut cmd = if std::path::Path::new(CAT).exists() {
        Command::new(CAT)
    } else {
        let mut cmd = Command::new(trampoline::SELF_EXE);
        cmd.arg0("xtr-lock").arg(ARG).arg(identity(&reader)?);
        cmd
    };
    // The command, and with it this process's copy of the read end, is dropped at once: the
    // sentinel must be the pipe's only reader.
    cmd.stdin(reader)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// The device and inode of an open file, as the sentinel's argument.
fn identity(file: &impl std::os::fd::AsFd) -> std::io::Result<OsString> {
    let st = rustix::fs::fstat(file)?;
    Ok(format!("{}:{}", st.st_dev, st.st_ino).into())
}

/// Runs the sentinel (where there is no `/bin/cat`) or the watcher if this process was
/// started as one; `None` otherwise.
pub(crate) fn run_if_asked() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    let mode = args.next()?;
    if mode == WATCH {
        Some(watcher(args))
    } else if mode == ARG {
        Some(sentinel(args))
    } else {
        None
    }
}

/// `__sentinel DEV:INO`: as `cat`, until its stdin, that pipe, has no writer left (nothing is
/// ever written to it).
fn sentinel(mut args: impl Iterator<Item = OsString>) -> ExitCode {
    let stdin = std::io::stdin();
    // Its stdin is the pipe it was told of: started by `run`, not typed.
    if !is_told(&stdin, args.next()) {
        return not_for_users(ARG);
    }
    read_to_the_end(stdin.lock())
}

/// The forked sentinel (see `helper`): its stdio detached, as `cat`'s, it waits for the end of
/// `pipe`, of which the watcher holds the only write end.
pub(crate) fn stand_for_the_group(pipe: PipeReader) -> ExitCode {
    let _ = detach_stdio(true);
    read_to_the_end(pipe)
}

/// Points stdin and stdout (and stderr if `all`) to `/dev/null`: a helper that keeps the
/// caller's would hold off whoever reads them to the end.
pub(crate) fn detach_stdio(all: bool) -> std::io::Result<()> {
    let null = std::fs::File::options()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    if all {
        rustix::stdio::dup2_stderr(&null)?;
    }
    Ok(())
}

/// Reads `pipe` until it has no writer left (nothing is ever written to it).
fn read_to_the_end(mut pipe: impl Read) -> ExitCode {
    let mut buf = [0u8; 64];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => return ExitCode::SUCCESS,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return ExitCode::from(exit::ERROR),
        }
    }
}

/// `__watch PARENT GRACE_MS DEV:INO [json]`: see the module's documentation.
fn watcher(mut args: impl Iterator<Item = OsString>) -> ExitCode {
    let number = |a: Option<OsString>| a?.into_string().ok()?.parse::<u64>().ok();
    let parent = number(args.next()).and_then(|p| i32::try_from(p).ok());
    let grace = number(args.next()).map(Duration::from_millis);
    let pipe = args.next();
    output::set_json(args.next().is_some_and(|a| a == trampoline::JSON));
    // Its stdout is the pipe it was told of, and it leads its group: started by `run`.
    let leads = rustix::process::getpgrp() == rustix::process::getpid();
    let (Some(parent), Some(grace), true) =
        (parent, grace, leads && is_told(&std::io::stdout(), pipe))
    else {
        return not_for_users(WATCH);
    };
    // Signals sent to the command's group are not for the watcher, which they would end.
    if let Err(e) = watch::block_the_commands_signals() {
        output::error_line(&format!("cannot watch signals: {e}"));
        return ExitCode::from(exit::ERROR);
    }
    watch(&watch::Parent::open(parent), grace, &std::io::stdout())
}

/// Whether `file` is the pipe `told` names (by identity, as [`identity`] gives it).
fn is_told(file: &impl std::os::fd::AsFd, told: Option<OsString>) -> bool {
    rustix::fs::fstat(file).is_ok_and(|held| {
        FileType::from_raw_mode(held.st_mode) == FileType::Fifo
            && told.is_some_and(|told| identity(file).is_ok_and(|id| id == told))
    })
}

fn not_for_users(mode: &str) -> ExitCode {
    output::error_line(&format!("{mode} is for xtr-lock run's own use"));
    ExitCode::from(exit::ERROR)
}

/// Watches `parent` and the sentinel at the other end of `pipe`: once both are gone, stops
/// this process's group after `grace`; once only `parent` is, ends when the group has nothing
/// else left.
pub(crate) fn watch(parent: &watch::Parent, grace: Duration, pipe: &impl AsFd) -> ExitCode {
    let mut sentinel_gone = false;
    loop {
        let orphaned = !parent.alive();
        if orphaned && sentinel_gone {
            // xtr-lock's whole group was killed: stop the command's, as a loss would.
            let at = Instant::now();
            procs::terminate_group();
            watch::outlast_group(at + grace);
            return ExitCode::SUCCESS;
        }
        // The write end of a pipe reports an error once the pipe has no reader left (asked
        // for nothing else, as a pipe with room is always writable).
        let watched: &[(&dyn AsFd, PollFlags)] = if sentinel_gone {
            &[]
        } else {
            &[(pipe, PollFlags::empty())]
        };
        let seen = watch::wait(
            (!orphaned).then_some(parent),
            watched,
            orphaned.then_some(ORPHAN_POLL),
        );
        if seen
            .first()
            .is_some_and(|r| r.intersects(PollFlags::ERR | PollFlags::HUP))
        {
            sentinel_gone = true;
        } else if orphaned && !others_in_group() {
            // xtr-lock was killed alone: the command ran on with the lock, and has ended.
            return ExitCode::SUCCESS;
        }
    }
}

/// Whether a process of this process's group other than itself runs.
fn others_in_group() -> bool {
    let group = rustix::process::getpgrp().as_raw_nonzero().get();
    let me = rustix::process::getpid().as_raw_nonzero().get();
    procs::running_in_group(group, Some(me))
}
