//! The helper `run` forks at its start, before its runtime or any thread exists, and later
//! turns into what its command needs: on flock the watcher that leads the command's group (and
//! the sentinel it forks into `xtr-lock`'s group, see `sentinel`), where the lock dies with
//! `xtr-lock` the command's supervisor (see `trampoline`). A forked copy costs a fraction of a
//! start of this executable (see `fork`), and can be made only while the process has one thread,
//! so it is made before it is known to be needed, and waits.
//!
//! `xtr-lock` tells it its role over a pipe (one request, then the pipe is closed; a pipe
//! closed with nothing in it, `xtr-lock` exiting included, ends it), and learns over another
//! that it took it: it then leads a process group of its own, the command's. Where that fails
//! (a request after the first, in `--standby`'s later turns; a helper that died), `run` starts
//! this executable again as before.

use std::ffi::OsString;
use std::io::{PipeReader, PipeWriter, Read as _, Write as _};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use rustix::process::Pid;

use crate::fork::{Forked, fork};
use crate::{exit, output, sentinel, trampoline, watch};

/// The helper forked at the start, until a run takes it.
static PREFORKED: Mutex<Option<Helper>> = Mutex::new(None);

/// The roles, as a request's first field.
const WATCH: &[u8] = b"watch";
const SUPERVISE: &[u8] = b"supervise";

/// `xtr-lock`'s side of a forked helper that has no role yet.
#[derive(Debug)]
pub(crate) struct Helper {
    pid: Pid,
    request: PipeWriter,
    ready: PipeReader,
}

/// Forks the helper; call only before any thread starts (at the top of `main`). In the parent:
/// `None` (the helper kept for [`take`]; nothing forked where that failed). In the helper: its
/// exit code, once its role is over.
pub(crate) fn prefork() -> Option<ExitCode> {
    // Nothing buffered may be written twice.
    let _ = std::io::stdout().flush();
    let parent = rustix::process::getpid().as_raw_nonzero().get();
    let (request_reader, request) = std::io::pipe().ok()?;
    let (ready, ready_writer) = std::io::pipe().ok()?;
    match fork() {
        Ok(Forked::Parent(pid)) => {
            drop((request_reader, ready_writer));
            *PREFORKED.lock().unwrap_or_else(|e| e.into_inner()) = Some(Helper {
                pid,
                request,
                ready,
            });
            None
        }
        Ok(Forked::Child) => {
            drop((request, ready));
            Some(serve(parent, request_reader, ready_writer))
        }
        Err(_) => None,
    }
}

/// The forked helper, the first time it is asked for; `None` after (or if none was forked).
pub(crate) fn take() -> Option<Helper> {
    PREFORKED.lock().unwrap_or_else(|e| e.into_inner()).take()
}

impl Helper {
    /// Makes it the watcher of a new process group (see `sentinel`), stopping the group
    /// `grace` after both `xtr-lock` and its sentinel are gone; its pid, the group's, once it
    /// leads it and its sentinel is in `xtr-lock`'s group.
    pub(crate) fn watch(self, grace: Duration) -> std::io::Result<Pid> {
        self.ask(&[WATCH.into(), millis(grace), json_option()])
    }

    /// Makes it the supervisor of `command` (see `trampoline`), run with `env` set (or
    /// removed, for `None`) in a new process group that the helper heads; its pid, the
    /// group's, once it heads it.
    pub(crate) fn supervise(
        self,
        grace: Duration,
        lease: Option<&Path>,
        env: &[(&str, Option<OsString>)],
        command: &[OsString],
    ) -> std::io::Result<Pid> {
        let lease = lease.map_or(trampoline::NO_LEASE.as_bytes(), |p| {
            p.as_os_str().as_bytes()
        });
        let mut fields = vec![
            SUPERVISE.to_vec(),
            millis(grace),
            json_option(),
            lease.to_vec(),
        ];
        fields.push(env.len().to_string().into_bytes());
        fields.extend(env.iter().map(|(name, value)| match value {
            Some(value) => [b"+", name.as_bytes(), b"=", value.as_bytes()].concat(),
            None => [b"-", name.as_bytes()].concat(),
        }));
        fields.extend(command.iter().map(|w| w.as_bytes().to_vec()));
        self.ask(&fields)
    }

    /// Sends the request and waits for the helper to say it took its role.
    fn ask(self, fields: &[Vec<u8>]) -> std::io::Result<Pid> {
        let Helper {
            pid,
            mut request,
            mut ready,
        } = self;
        let mut bytes = Vec::new();
        for field in fields {
            let len = u32::try_from(field.len()).map_err(std::io::Error::other)?;
            bytes.extend_from_slice(&len.to_le_bytes());
            bytes.extend_from_slice(field);
        }
        request.write_all(&bytes)?;
        drop(request);
        let mut byte = [0];
        ready.read_exact(&mut byte).inspect_err(|_| {
            // It died before taking its role: reaped, if it is gone already.
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
        })?;
        Ok(pid)
    }
}

/// `json` where `run --json` asks for events, as the helpers' argument says it.
fn json_option() -> Vec<u8> {
    match output::json() {
        true => trampoline::JSON.into(),
        false => Vec::new(),
    }
}

fn millis(d: Duration) -> Vec<u8> {
    d.as_millis().to_string().into_bytes()
}

/// The helper's side: reads its role, takes it.
fn serve(parent: i32, mut request: PipeReader, ready: PipeWriter) -> ExitCode {
    let mut bytes = Vec::new();
    if request.read_to_end(&mut bytes).is_err() {
        return ExitCode::from(exit::ERROR);
    }
    drop(request);
    let fields = decode(&bytes);
    let mut fields = fields.into_iter();
    let role = fields.next();
    let grace = fields
        .next()
        .and_then(|g| String::from_utf8(g).ok()?.parse().ok());
    let json = fields
        .next()
        .is_some_and(|j| j == trampoline::JSON.as_bytes());
    output::set_json(json);
    match (role.as_deref(), grace.map(Duration::from_millis)) {
        (Some(WATCH), Some(grace)) => watcher(parent, grace, ready),
        (Some(SUPERVISE), Some(grace)) => supervisor(parent, grace, fields, ready),
        // Not needed (nothing, `xtr-lock` gone), or a request it does not know.
        _ => ExitCode::SUCCESS,
    }
}

/// The fields of a request, as [`Helper::ask`] wrote them (a torn one is dropped).
fn decode(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut fields = Vec::new();
    while let Some((len, rest)) = bytes.split_first_chunk::<4>() {
        let len = u32::from_le_bytes(*len) as usize;
        let Some((field, rest)) = rest.split_at_checked(len) else {
            break;
        };
        fields.push(field.to_vec());
        bytes = rest;
    }
    fields
}

/// The watcher: forks the sentinel while still in `xtr-lock`'s group (a group killed from
/// here on kills the sentinel; before, the watcher too, and no command runs), then leads a
/// group of its own and says so.
fn watcher(parent: i32, grace: Duration, mut ready: PipeWriter) -> ExitCode {
    let Ok((reader, writer)) = std::io::pipe() else {
        return ExitCode::from(exit::ERROR);
    };
    match fork() {
        Ok(Forked::Child) => {
            drop((writer, ready));
            return sentinel::stand_for_the_group(reader);
        }
        Ok(Forked::Parent(_)) => drop(reader),
        Err(e) => {
            output::error_line(&format!("cannot fork the sentinel: {e}"));
            return ExitCode::from(exit::ERROR);
        }
    }
    if let Err(e) = watch::block_the_commands_signals() {
        output::error_line(&format!("cannot watch signals: {e}"));
        return ExitCode::from(exit::ERROR);
    }
    let watched = watch::Parent::open(parent);
    if rustix::process::setpgid(None, None).is_err() || ready.write_all(b"1").is_err() {
        return ExitCode::from(exit::ERROR);
    }
    drop(ready);
    // The caller's stdin and stdout are the command's, not the watcher's (as when started).
    let _ = sentinel::detach_stdio(false);
    sentinel::watch(&watched, grace, &writer)
}

/// The supervisor: heads a group of its own, says so, runs the command in it.
fn supervisor(
    parent: i32,
    grace: Duration,
    mut fields: impl Iterator<Item = Vec<u8>>,
    mut ready: PipeWriter,
) -> ExitCode {
    let lease = fields
        .next()
        .filter(|l| l != trampoline::NO_LEASE.as_bytes())
        .map(OsString::from_vec);
    let count = fields
        .next()
        .and_then(|n| String::from_utf8(n).ok()?.parse().ok());
    let env: Vec<(OsString, Option<OsString>)> = fields
        .by_ref()
        .take(count.unwrap_or(0))
        .filter_map(|entry| match entry.split_first() {
            Some((b'+', rest)) => {
                let at = rest.iter().position(|&b| b == b'=')?;
                let (name, value) = (&rest[..at], &rest[at + 1..]);
                Some((
                    OsString::from_vec(name.to_vec()),
                    Some(OsString::from_vec(value.to_vec())),
                ))
            }
            Some((b'-', name)) => Some((OsString::from_vec(name.to_vec()), None)),
            _ => None,
        })
        .collect();
    let command: Vec<OsString> = fields.map(OsString::from_vec).collect();
    if count.is_none() || command.is_empty() {
        return ExitCode::from(exit::ERROR);
    }
    if rustix::process::setpgid(None, None).is_err() || ready.write_all(b"1").is_err() {
        return ExitCode::from(exit::ERROR);
    }
    drop(ready);
    trampoline::supervise_command(parent, grace, lease, &command, &env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_a_torn_field_is_dropped() {
        let fields: Vec<Vec<u8>> = vec![b"watch".to_vec(), Vec::new(), b"a=b\0c".to_vec()];
        let mut bytes = Vec::new();
        for f in &fields {
            bytes.extend_from_slice(&(f.len() as u32).to_le_bytes());
            bytes.extend_from_slice(f);
        }
        assert_eq!(decode(&bytes), fields);
        assert_eq!(decode(&bytes[..bytes.len() - 1]), fields[..2].to_vec());
        assert!(decode(&[]).is_empty());
    }
}
