//! What the server helpers share about the processes they start.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use rustix::process::Pid;

/// The pid of `child`.
pub(crate) fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("a pid")).expect("a pid")
}

/// Waits until `ready` says the server `what` answers, failing with its log when it exits first
/// or is not up `within`.
pub(crate) fn wait_up(
    child: &mut Child,
    what: &str,
    log: &Path,
    within: Duration,
    mut ready: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + within;
    while !ready() {
        let log = || std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            child.try_wait().ok().flatten().is_none(),
            "{what} exited; its log: {}",
            log()
        );
        assert!(
            Instant::now() < deadline,
            "{what} did not come up within {within:?}; its log: {}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
