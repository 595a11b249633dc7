//! `run --min-hold` and `--max-hold`: the lock given its limits, the command stopped when the
//! maximum hold is reached (exit 4) or the lock lost (exit 3, revoked included), and the
//! release that waits a minimum hold out where the store cannot do it alone.

use std::time::Duration;

use anyhow::Result;
use serde_json::json;
use tokio::time::Instant;
use xtr_lock::{Lock, LockLost, Lockable as _, LostReason, MAX_HOLD_GRACE, Release};

use super::child::Child;
use super::{RunArgs, Signals, loss_line, report_loss, stop};
use crate::exit::Exit;
use crate::output::{self, short};

/// `lock` with `--min-hold` and `--max-hold` (none: unchanged).
pub(super) fn with_limits(lock: Lock, args: &RunArgs) -> Lock {
    lock.with_min_hold(args.holds.min.unwrap_or_default())
        .with_max_hold(args.holds.max.unwrap_or_default())
}

/// The monitor's news while the command runs: the maximum hold reached (exit 4, a `max-hold`
/// event) or the lock lost (exit 3, a `lost` event with its `why`); either way the command's
/// process group is stopped. At the maximum hold the lock lives [`MAX_HOLD_GRACE`] longer at
/// most: SIGKILL comes after `--kill-after` or two seconds less than that, whichever is
/// sooner, so that the command is dead before the lock can run out.
pub(super) async fn on_lost(
    args: &RunArgs,
    lost: &LockLost,
    child: &mut Child,
    acquired: Instant,
) -> Result<Exit> {
    let too_long = lost.reason == LostReason::HeldTooLong;
    let grace = stop_grace(args);
    let stopping = format!(
        "stopping the command (SIGTERM, then SIGKILL after {})",
        short(grace)
    );
    let exit = if too_long {
        let line = format!(
            "lock {:?} was held for its maximum hold ({}); {stopping}",
            args.resource,
            short(acquired.elapsed())
        );
        report_max_hold(&args.resource, acquired, &line);
        Exit::HeldTooLong
    } else {
        report_loss(
            &args.resource,
            &format!("{}; {stopping}", loss_line(lost)),
            Some(lost.reason),
        );
        Exit::Lost
    };
    stop(child, grace).await?;
    Ok(exit)
}

/// How long the command's group has between SIGTERM and SIGKILL: `--kill-after`, but with a
/// maximum hold two seconds less than [`MAX_HOLD_GRACE`] at most, so that the command is dead
/// before its lock can run out (the supervisor's stop before a lease ends uses it too).
pub(super) fn stop_grace(args: &RunArgs) -> Duration {
    match args.holds.max {
        Some(_) => args
            .kill_after
            .min(MAX_HOLD_GRACE.saturating_sub(Duration::from_secs(2))),
        None => args.kill_after,
    }
}

/// Says the maximum hold was reached: `line`, or a `max-hold` event.
pub(super) fn report_max_hold(resource: &str, acquired: Instant, line: &str) {
    if output::json() {
        let held = acquired.elapsed().as_millis() as u64;
        output::event("max-hold", json!({"resource": resource, "held_ms": held}));
    } else {
        eprintln!("xtr-lock: {line}");
    }
}

/// Releases `lock` after the command ended. Within a minimum hold, the store lets the lock
/// run out when it ends (at once), or `xtr-lock` keeps holding it until then (flock, session
/// locks, pub/sub, SysV): that wait is not cut short by the exit's bound, but SIGINT or
/// SIGTERM end it (the lock released at once). Otherwise bounded as every exit's release.
pub(super) async fn release(
    args: &RunArgs,
    lock: &Lock,
    signals: &mut Signals,
    acquired: Instant,
) -> xtr_lock::Result<Release> {
    let left = args
        .holds
        .min
        .map(|min| min.saturating_sub(acquired.elapsed()))
        .filter(|left| !left.is_zero() && lock.held_mode().is_some());
    let Some(left) = left else {
        return bounded(lock, lock.release()).await;
    };
    if signals.stop.is_some() {
        // Told to stop while the command ran: no minimum hold is waited out.
        lock.cut_min_hold();
    }
    if output::json() {
        output::event(
            "min-hold",
            json!({"resource": args.resource, "left_ms": left.as_millis() as u64}),
        );
    } else if args.take.verbose {
        eprintln!(
            "xtr-lock: {:?} stays held until its minimum hold ends, {} from now",
            args.resource,
            short(left)
        );
    }
    let releasing = lock.release();
    tokio::pin!(releasing);
    let said = tokio::time::sleep(Duration::from_millis(200));
    tokio::pin!(said);
    let bound = tokio::time::sleep(left + crate::exit::SETTLE);
    tokio::pin!(bound);
    let mut told = false;
    loop {
        tokio::select! {
            released = &mut releasing => return released,
            () = &mut said, if !told => {
                told = true;
                if args.take.verbose && !output::json() {
                    eprintln!(
                        "xtr-lock: holding it here until then: this store's locks end with \
                         their holder (SIGINT/SIGTERM: release now)"
                    );
                }
            }
            () = &mut bound => return Err(super::unconfirmed_release(lock)),
            // SIGHUP (a closed terminal) leaves the hold as it is.
            sig = signals.recv() => if sig != rustix::process::Signal::HUP { break },
        }
    }
    // Interrupted: the pending release lets go at once.
    lock.cut_min_hold();
    bounded(lock, releasing).await
}

/// `lock`'s release within the exit's bound: not confirmed by then is an error.
async fn bounded(
    lock: &Lock,
    release: impl Future<Output = xtr_lock::Result<Release>>,
) -> xtr_lock::Result<Release> {
    crate::exit::bounded(release)
        .await
        .unwrap_or_else(|| Err(super::unconfirmed_release(lock)))
}
