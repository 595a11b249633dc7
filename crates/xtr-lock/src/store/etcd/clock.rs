//! The clock a lease's confirmed end is kept on: one that counts the time the machine was
//! suspended (`CLOCK_BOOTTIME`). The monotonic clock behind [`std::time::Instant`] stops during
//! suspend, while etcd's leases run on: a holder that slept through its lease's end would wake
//! believing it had as long left as when it went to sleep.

use std::time::Duration;

/// A reading of the boot clock (time since boot, suspend included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct BootInstant(Duration);

impl BootInstant {
    /// Now, on the boot clock.
    pub(super) fn now() -> BootInstant {
        BootInstant(boot_clock())
    }

    /// `d` later (saturating: a lease never ends past the end of time).
    pub(super) fn after(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(d))
    }

    /// How long from `earlier` to this reading; zero if it is not later.
    pub(super) fn since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn boot_clock() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Elsewhere the monotonic clock, counted from the first reading (what the platform offers;
/// on macOS it counts suspend too).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boot_clock() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

/// How long a lease confirmed until `end` certainly lasts at `now`.
pub(super) fn left(end: BootInstant, now: BootInstant) -> Duration {
    end.since(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reading is CLOCK_BOOTTIME's, not CLOCK_MONOTONIC's: bracketed by two direct reads of
    /// the boot clock. (The two differ by the time this machine has spent suspended; where it
    /// never was, the bracket is what tells them apart from a clock of another origin.)
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn the_confirmed_end_is_kept_on_the_boot_clock() {
        use rustix::time::{ClockId, clock_gettime};
        let read = |id| {
            let t = clock_gettime(id);
            Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
        };
        let before = read(ClockId::Boottime);
        let ours = BootInstant::now().0;
        let after = read(ClockId::Boottime);
        assert!(
            before <= ours && ours <= after,
            "{before:?} {ours:?} {after:?}"
        );
        // Never behind the monotonic clock (boot time = monotonic + time suspended).
        let monotonic = read(ClockId::Monotonic);
        assert!(BootInstant::now().0 + Duration::from_millis(5) >= monotonic);
    }

    /// A lease confirmed for 10 s, then a suspend of an hour: on waking, nothing is left (a
    /// clock that stopped while suspended would still say 10 s).
    #[test]
    fn a_lease_that_ended_during_a_suspend_has_nothing_left() {
        let confirmed_at = BootInstant(Duration::from_secs(1000));
        let end = confirmed_at.after(Duration::from_secs(10));
        assert_eq!(left(end, confirmed_at), Duration::from_secs(10));
        let woke = confirmed_at.after(Duration::from_secs(3600));
        assert_eq!(left(end, woke), Duration::ZERO);
        assert_eq!(end.since(woke), Duration::ZERO);
    }
}
