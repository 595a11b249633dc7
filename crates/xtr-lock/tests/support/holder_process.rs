//! A holder in another process: this test binary run again on one of its ignored tests, which
//! takes what it is told to through an environment variable, prints `held` and sleeps until
//! the test that started it kills it (SIGKILL: no clean-up of its own).

use std::ffi::OsStr;
use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

/// Runs the ignored test `test` (its full name) of this binary with `var` set to `value`, and
/// returns once it printed `held`.
pub(crate) fn start(test: &str, var: &str, value: impl AsRef<OsStr>) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--ignored", "--nocapture"])
        .env(var, value)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l == "held")),
        "the holder process never held"
    );
    child
}
