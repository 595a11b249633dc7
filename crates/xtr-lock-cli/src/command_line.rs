//! `run`'s command line past its flags: the command it runs (words, or `-c`), and flock(1)'s
//! flags it refuses, saying what to do instead.

use std::ffi::OsString;

use anyhow::{Result, anyhow};

/// Refuses flock(1)'s `-u` (unlock a descriptor) and `-F` (exec the command in flock's place),
/// saying what to do instead.
pub(crate) fn refuse_flock_only(unlock: bool, no_fork: bool) -> Result<()> {
    if unlock {
        return Err(anyhow!(
            "-u/--unlock drops a lock held on a descriptor (flock -u FD), and `run` holds \
             none for you: it releases when the command exits; a lock taken with `xtr-lock \
             acquire` is released with `xtr-lock release KEY`, one taken with `acquire --fd N` \
             by closing the descriptor (exec N>&-)"
        ));
    }
    if no_fork {
        return Err(anyhow!(
            "-F/--no-fork would put the command in xtr-lock's place, and xtr-lock stays to \
             watch the lock and release it when the command exits: leave -F out (on flock the \
             command holds the lock's descriptor, as under -F), or lock a descriptor of your \
             shell and exec the command yourself: exec 9>\"$(xtr-lock path R)\"; xtr-lock \
             acquire --fd 9 R && exec COMMAND"
        ));
    }
    Ok(())
}

/// The command `run` runs: its words, or `sh -c` and the line given with `-c`.
///
/// clap ends the options at the first `--`, so in `run -- -x -- COMMAND` (a resource that
/// starts with `-`) the second `--` reaches the command's words: it only separates them from
/// the resource, as after a resource without a dash (no command is called `--`).
pub(crate) fn command_line(
    shell: Option<OsString>,
    mut command: Vec<OsString>,
    resource: &str,
) -> Result<Vec<OsString>> {
    if command.first().is_some_and(|w| w == "--") {
        command.remove(0);
    }
    match (shell, command.is_empty()) {
        (Some(line), true) => Ok(vec!["sh".into(), "-c".into(), line]),
        (Some(_), false) => Err(anyhow!(
            "give the command either as words after the resource or as -c 'shell \
             command', not both"
        )),
        (None, false) => Ok(command),
        (None, true) => Err(anyhow!(
            "no command to run: give it after the resource (xtr-lock run {resource:?} \
             ./job.sh) or as -c 'shell command'"
        )),
    }
}
