//! Exit codes: the command's own status where there is a command, and these otherwise.

/// What `xtr-lock` exits with when it is not passing on a command's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Success.
    Ok,
    /// The lock is held by someone else (`-n`, or `-w` ran out); `-E` changes the number.
    Conflict(u8),
    /// `status`: nobody holds the resource; `leader`: nobody leads.
    Free,
    /// Bad usage or configuration, or the store failed: the message says what and how to fix.
    Error,
    /// The lock was lost while the command ran (the command was terminated), or a key handed
    /// in names a lock that is no longer held.
    Lost,
    /// `run --max-hold`: the lock was held as long as it may be; the command was stopped and
    /// the lock released.
    HeldTooLong,
    /// The command could not be run (`126`: not executable, `127`: not found, as shells do).
    CannotRun(u8),
    /// The command's own status (128 + N when killed by signal N).
    Command(u8),
    /// `config check --ping`: a store could not be reached (`EX_UNAVAILABLE`).
    Unavailable,
}

/// How long the exit waits for the store, from the first time it waits (the release after the
/// command, closing the store, or settling its calls still running): a release whose server
/// does not answer (paused, partitioned, a quorum's slowest member) goes on in the background
/// until then, and what it did not release is held until its ttl ends.
pub(crate) const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// When the exit stops waiting for the store: [`SETTLE`] after it first asked.
pub(crate) fn deadline() -> std::time::Instant {
    static DEADLINE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *DEADLINE.get_or_init(|| std::time::Instant::now() + SETTLE)
}

/// Runs `fut` until the exit's bound ([`deadline`]): `None` past it. A lock call given up on
/// goes on in the background (its holder's executor runs it to its end) until the exit's
/// settle.
pub(crate) async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> Option<T> {
    let deadline = tokio::time::Instant::from_std(deadline());
    tokio::time::timeout_at(deadline, fut).await.ok()
}

/// Lets the store calls still running finish before the runtime (and they with it) is dropped;
/// says so with -v (or --json) when the bound is hit.
pub(crate) async fn settle() {
    let left = deadline().saturating_duration_since(std::time::Instant::now());
    if xtr_lock::settle(left).await {
        return;
    }
    if crate::output::json() {
        crate::output::event(
            "unsettled",
            serde_json::json!({ "waited_ms": SETTLE.as_millis() as u64 }),
        );
    } else if crate::output::verbose() {
        eprintln!(
            "xtr-lock: store calls of this process (clean-ups) still running after {SETTLE:?}; \
             exiting without them (a lock they would have released is held until its ttl ends)"
        );
    }
}

/// The lock was lost.
pub(crate) const LOST: u8 = 3;
/// Usage, configuration or store error.
pub(crate) const ERROR: u8 = 2;
/// `run --max-hold`: held as long as it may be.
pub(crate) const HELD_TOO_LONG: u8 = 4;

impl Exit {
    pub(crate) fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Free => 1,
            Exit::Conflict(n) | Exit::CannotRun(n) | Exit::Command(n) => n,
            Exit::Error => ERROR,
            Exit::Lost => LOST,
            Exit::HeldTooLong => HELD_TOO_LONG,
            Exit::Unavailable => 69,
        }
    }
}

/// The exit-code table of `--help` and the README.
pub(crate) const TABLE: &str = "\
Exit codes:
  0        success (for run: the command succeeded)
  1        the lock is held by someone else (-n, or -w ran out); -E/--conflict-exit-code changes it
  2        usage, configuration or store error (bad DSN, duration, unreachable server, ...)
  3        the lock was lost while the command ran (it was terminated; revoked included), or
           a handed-in key's lock is no longer held
  4        run --max-hold: the lock was held as long as it may be (the command was terminated)
  revoke:  0 the resource is free, 1 holders remain after -w, 2 error
  status:  0 held, 1 free, 2 error or the store cannot tell; with --key 0 held by it, 3 not
  leader:  0 someone leads, 1 nobody leads, 2 error or the store cannot tell
  69       config check --ping: a configured store could not be reached
  126/127  the command cannot be executed / was not found
  N        otherwise run exits with the command's own status; 128+N if it was killed by signal N";
