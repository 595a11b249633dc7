//! The lease file: how `run` tells its command's supervisor until when the lock is certainly
//! held, so that the command is stopped before its lease ends even when `xtr-lock` itself
//! cannot act (stopped with SIGSTOP, paused by the machine, starved): a dead man's switch.
//!
//! `run` rewrites one record in a private temporary file whenever it learns more (about ten
//! times per lease while it runs): the end of the confirmed lease on the boot-time clock, which
//! every process of the machine shares and which, unlike the monotonic clock, goes on while the
//! machine is suspended (a lease that ended during a suspend is over on resume), and the length
//! of the lease, from which the margins are computed. The supervisor reads it every
//! [`POLL`]; when the lease is about to end without a newer record, it stops the command's
//! process group (SIGTERM, then SIGKILL before the lease ends). The file goes by path (the
//! supervisor, forked before the file exists or started again, has no descriptor of it); the
//! supervisor unlinks it once it has opened it.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::Duration;

/// How often the supervisor reads the record.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// Where the supervisor marks that it stopped the command for the lease (one byte, 1).
const STOPPED_AT: u64 = 24;

/// Guards against reading a record half-written.
const CHECK: u64 = 0x7874_722d_6c6f_636b;

/// Nanoseconds on the boot-time clock (shared by every process of the machine, counting the
/// time the machine was suspended).
pub(crate) fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// One record: the lease certainly lasts until `until_ns` (boot-time clock); `length` is the
/// longest lease the store has confirmed (about what it really keeps, which on some stores is
/// less than the ttl asked for: whole seconds, taken up to 1 s early; pub/sub's probe timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) until_ns: u64,
    pub(crate) length: Duration,
}

impl Lease {
    /// A lease that lasts `remaining` from now, of a store whose leases last `length`.
    pub(crate) fn from_now(remaining: Duration, length: Duration) -> Lease {
        let left = u64::try_from(remaining.as_nanos()).unwrap_or(u64::MAX);
        Lease {
            until_ns: now_ns().saturating_add(left),
            length,
        }
    }

    /// When the command must be stopped: a tenth of the lease (at least 50 ms, at most 1 s)
    /// before it ends, SIGKILL; SIGTERM that much again (at most `grace`) earlier. Renewals come
    /// every third of the lease, so a holder that renews in time is never stopped.
    pub(crate) fn deadlines(&self, grace: Duration) -> (u64, u64) {
        let margin = (self.length / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let margin = u64::try_from(margin.as_nanos()).unwrap_or(u64::MAX);
        let term_window = u64::try_from((self.length / 4).min(grace).as_nanos()).unwrap_or(0);
        let kill_at = self.until_ns.saturating_sub(margin);
        (kill_at.saturating_sub(term_window), kill_at)
    }

    fn encode(&self) -> [u8; 24] {
        let length = u64::try_from(self.length.as_millis()).unwrap_or(u64::MAX);
        let mut out = [0; 24];
        out[..8].copy_from_slice(&self.until_ns.to_le_bytes());
        out[8..16].copy_from_slice(&length.to_le_bytes());
        out[16..].copy_from_slice(&(self.until_ns ^ length ^ CHECK).to_le_bytes());
        out
    }

    fn decode(bytes: &[u8; 24]) -> Option<Lease> {
        let word = |i: usize| {
            let mut w = [0; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let (until_ns, length, check) = (word(0), word(1), word(2));
        (check == until_ns ^ length ^ CHECK).then(|| Lease {
            until_ns,
            length: Duration::from_millis(length),
        })
    }
}

/// `run`'s side: the file, created private (0600) in the temporary directory.
pub(crate) struct Writer {
    file: tempfile::NamedTempFile,
}

impl Writer {
    pub(crate) fn create() -> std::io::Result<Writer> {
        let file = tempfile::Builder::new()
            .prefix("xtr-lock-lease-")
            .tempfile()?;
        Ok(Writer { file })
    }

    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    /// Records `lease`; a failure is ignored (the supervisor then acts on the older record,
    /// which ends sooner: the safe side).
    pub(crate) fn tell(&self, lease: Lease) {
        let _ = self.file.as_file().write_all_at(&lease.encode(), 0);
    }

    /// Whether the supervisor stopped the command because the lease was about to end.
    pub(crate) fn was_stopped(&self) -> bool {
        let mut flag = [0];
        self.file
            .as_file()
            .read_exact_at(&mut flag, STOPPED_AT)
            .is_ok()
            && flag[0] == 1
    }
}

/// The supervisor's side.
pub(crate) struct Reader {
    file: File,
    last: Option<Lease>,
}

impl Reader {
    /// Opens the file at `path` and unlinks it (only the two processes need it now).
    pub(crate) fn open(path: &Path) -> std::io::Result<Reader> {
        let file = File::options().read(true).write(true).open(path)?;
        let _ = std::fs::remove_file(path);
        Ok(Reader { file, last: None })
    }

    /// The newest whole record (a torn one is skipped: the previous one stands).
    pub(crate) fn read(&mut self) -> Option<Lease> {
        let mut buf = [0; 24];
        if self.file.read_exact_at(&mut buf, 0).is_ok()
            && let Some(lease) = Lease::decode(&buf)
        {
            self.last = Some(lease);
        }
        self.last
    }

    /// Tells `run` that the command is being stopped for the lease.
    pub(crate) fn mark_stopped(&self) {
        let _ = self.file.write_all_at(&[1], STOPPED_AT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_torn_ones_are_refused() {
        let lease = Lease {
            until_ns: 123_456_789,
            length: Duration::from_secs(60),
        };
        let bytes = lease.encode();
        assert_eq!(Lease::decode(&bytes), Some(lease));
        let mut torn = bytes;
        torn[3] ^= 1;
        assert_eq!(Lease::decode(&torn), None);
    }

    #[test]
    fn the_command_is_stopped_before_the_lease_ends() {
        let lease = Lease {
            until_ns: 10_000_000_000,
            length: Duration::from_secs(2),
        };
        let (term, kill) = lease.deadlines(Duration::from_secs(10));
        assert_eq!(
            kill,
            10_000_000_000 - 200_000_000,
            "a tenth of the lease before"
        );
        assert_eq!(
            term,
            kill - 500_000_000,
            "a quarter of the lease before that"
        );
        let (term, _) = lease.deadlines(Duration::from_millis(100));
        assert_eq!(term, kill - 100_000_000, "no longer than the grace");
    }

    #[test]
    fn the_writer_is_read_by_path_once() {
        let writer = Writer::create().unwrap();
        let lease = Lease::from_now(Duration::from_secs(5), Duration::from_secs(15));
        writer.tell(lease);
        let mut reader = Reader::open(writer.path()).unwrap();
        assert!(!writer.path().exists(), "unlinked once opened");
        assert_eq!(reader.read(), Some(lease));
        let later = Lease::from_now(Duration::from_secs(9), Duration::from_secs(15));
        writer.tell(later);
        assert_eq!(reader.read(), Some(later));
        assert!(!writer.was_stopped());
        reader.mark_stopped();
        assert!(writer.was_stopped());
        assert_eq!(
            reader.read(),
            Some(later),
            "the mark leaves the record alone"
        );
    }
}
