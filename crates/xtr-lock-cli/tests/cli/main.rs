//! The `xtr-lock` command on the stores that need no server (flock, memory, semaphores) or a
//! Redis the testkit starts: its commands, configuration files, defaults, help, warnings, a
//! terminal, a drop-in for flock(1), the command's life under `run`, hostile input, several
//! users.

#[path = "../common/mod.rs"]
mod common;

mod commands;
mod config;
mod defaults;
mod dropin;
mod flock_habits;
mod help;
mod helpers;
mod hostile;
mod jobs;
mod meta;
mod multiuser;
mod nested;
mod run_lifecycle;
mod standby;
mod terminal;
mod warnings;
