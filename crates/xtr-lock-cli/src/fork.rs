//! `fork(2)` without `exec`: the one module of the CLI with `unsafe` code (the workspace denies
//! it; `crates/xtr-lock/tests/house_rules.rs` names the modules allowed).
//!
//! `run`'s helpers (the watcher of its command's group and the group's sentinel on flock, the
//! command's supervisor elsewhere) used to be this 23 MB executable started again: 0.81 ms of
//! CPU per start here, most of it the dynamic loader and page faults, whatever the helper then
//! did (docs/benchmarks.md). A forked copy of a process that has not started its runtime skips
//! all of that. Rust's standard library offers no fork without exec because a fork of a process
//! with several threads leaves the child with one thread and whatever locks the others held;
//! [`fork`] therefore refuses unless the caller is the process's only thread.

#![allow(unsafe_code)]

use rustix::process::Pid;

/// Which side of a fork this is.
#[derive(Debug)]
pub(crate) enum Forked {
    /// The caller, with the child's pid.
    Parent(Pid),
    /// The new process.
    Child,
}

/// Forks this process, if it has exactly one thread (else an error, and nothing forked).
///
/// The child goes on from here with a copy of the memory and descriptors. It must not return
/// into anything that believes it is the original process: callers branch at once.
pub(crate) fn fork() -> std::io::Result<Forked> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(std::io::Error::other(format!(
            "cannot fork a process with {threads} threads"
        )));
    }
    // SAFETY: this process has one thread (checked above, and no thread starts between that
    // check and this call: this thread is busy here), so the child's one thread is a copy of
    // the only one there was, and no lock (the allocator's, stdio's) can be held by a thread
    // the child lacks. Every descriptor is duplicated as by `dup`, which the callers account
    // for.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => Pid::from_raw(child.as_raw())
            .map(Forked::Parent)
            .ok_or_else(|| std::io::Error::other("fork returned no pid")),
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
    }
}
