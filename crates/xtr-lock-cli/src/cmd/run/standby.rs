//! `run --standby`: a hot standby. Turns of `run` (take the lock, waiting as long as it takes;
//! run the command under the usual supervision; release) one after the other, until SIGINT or
//! SIGTERM, `--max-restarts`, or an error; a command that keeps failing quickly waits longer
//! and longer between turns, so that a crash loop does not spin.

use std::time::Duration;

use anyhow::Result;
use serde_json::json;
use xtr_lock::{Lock, Lockable as _};

use super::{RunArgs, Signals, Turn};
use crate::exit::Exit;
use crate::output::{self, short};

/// A failed run shorter than this counts as a crash: the next turn waits (the back-off).
const QUICK: Duration = Duration::from_secs(30);
/// The first back-off, doubled after each quick failure up to [`LONGEST`].
const FIRST: Duration = Duration::from_secs(1);
const LONGEST: Duration = Duration::from_secs(60);
/// The pause after a quick success: enough that a command that ends at once does not spin,
/// short enough that standbys taking turns are not slowed.
const QUICK_SUCCESS: Duration = Duration::from_millis(100);

/// Turns until stopped: the last turn's exit (the command's status, or 128+N when a signal
/// ended the wait for the lock).
pub(super) async fn run(
    args: &RunArgs,
    signals: &mut Signals,
    max_restarts: Option<u32>,
) -> Result<Exit> {
    let mut backoff = Duration::ZERO;
    let mut restarts = 0;
    loop {
        let turn = super::turn(args, signals).await?;
        let Some(ran) = turn.ran else {
            return Ok(turn.exit); // interrupted while waiting for the lock
        };
        stopped(args, &turn);
        if signals.stop.is_some() || max_restarts.is_some_and(|n| restarts >= n) {
            return Ok(turn.exit);
        }
        restarts += 1;
        backoff = next_backoff(backoff, turn.exit, ran);
        if backoff.is_zero() {
            continue;
        }
        if output::json() {
            let ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX);
            output::event(
                "backoff",
                json!({"resource": args.resource, "delay_ms": ms}),
            );
        } else if args.take.verbose {
            eprintln!(
                "xtr-lock: the command ended after {}; campaigning again in {}",
                short(ran),
                short(backoff)
            );
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = signals.recv() => return Ok(turn.exit),
        }
    }
}

/// The wait before the next campaign: none after a lost lock (somebody else leads now) or a
/// run of [`QUICK`] or more; after a quick success [`QUICK_SUCCESS`] (a command that ends at
/// once must not spin either); after a quick failure 1s, then twice the last, at most [`LONGEST`].
fn next_backoff(last: Duration, exit: Exit, ran: Duration) -> Duration {
    if matches!(exit, Exit::Lost) || ran >= QUICK {
        return Duration::ZERO;
    }
    if matches!(exit, Exit::Ok | Exit::Command(0)) {
        return QUICK_SUCCESS;
    }
    match last.is_zero() {
        true => FIRST,
        false => (last * 2).min(LONGEST),
    }
}

/// Says this standby leads now (`-v`, or a `leading` event), with its term.
pub(super) fn leading(args: &RunArgs, lock: &Lock) {
    let term = lock.fencing_token();
    if output::json() {
        output::event("leading", json!({"resource": args.resource, "term": term}));
    } else if args.take.verbose {
        let term = term.map_or_else(String::new, |t| format!(" (term {t})"));
        eprintln!("xtr-lock: leading {:?}{term}", args.resource);
    }
}

/// Says this standby stopped leading and why (`-v`, or a `stopped` event).
fn stopped(args: &RunArgs, turn: &Turn) {
    let why = match turn.exit {
        Exit::Lost => "the lock was lost".to_owned(),
        Exit::Command(n) if n > 128 => format!("the command was killed by signal {}", n - 128),
        Exit::Command(n) => format!("the command exited with status {n}"),
        Exit::CannotRun(n) => format!("the command could not be run ({n})"),
        Exit::Error => "releasing the lock failed".to_owned(),
        other => format!("exit {}", other.code()),
    };
    if output::json() {
        output::event(
            "stopped",
            json!({"resource": args.resource, "why": why, "status": turn.exit.code()}),
        );
    } else if args.take.verbose {
        eprintln!("xtr-lock: stopped leading {:?}: {why}", args.resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_failures_back_off_and_the_rest_do_not() {
        let s = Duration::from_secs;
        assert_eq!(next_backoff(s(0), Exit::Command(1), s(1)), s(1));
        assert_eq!(next_backoff(s(1), Exit::Command(1), s(1)), s(2));
        assert_eq!(next_backoff(s(32), Exit::Command(1), s(1)), s(60));
        assert_eq!(next_backoff(s(60), Exit::Command(1), s(1)), s(60));
        assert_eq!(next_backoff(s(8), Exit::Command(1), s(31)), s(0));
        assert_eq!(
            next_backoff(s(8), Exit::Command(0), s(1)),
            QUICK_SUCCESS,
            "no spin on success"
        );
        assert_eq!(next_backoff(s(8), Exit::Command(0), s(31)), s(0));
        assert_eq!(next_backoff(s(8), Exit::Lost, s(1)), s(0));
        assert_eq!(next_backoff(s(0), Exit::CannotRun(127), s(0)), s(1));
    }
}
