//! Who holds a lock file: the `FLOCK` entries of `/proc/locks` for its device and inode.
//!
//! The kernel builds `/proc/locks` a page per `read(2)` and lets go of its lock table between
//! pages, so a read of more than a page is not a snapshot: locks taken or let go elsewhere in
//! the meantime shift the entries, and one read can list a holder twice or not at all (hundreds
//! of locks changing nearby make that happen on most reads). [`snapshot`] reads until two
//! whole reads in a row agree, which only an unchanged table gives.

use std::collections::HashMap;
use std::io::Read as _;

use crate::key::Mode;

/// How long [`snapshot`] goes on reading before saying the table never held still.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// A consistent copy of `/proc/locks`: `Ok(None)` when it changed between every two reads made
/// in [`PATIENCE`]. One read takes tens of microseconds, so a table changing thousands of
/// times a second still holds still long enough within a few reads; only a tight loop of
/// locking elsewhere can starve this reader. Between reads the task yields, so a runtime
/// thread is never held for long.
pub(crate) async fn snapshot() -> std::io::Result<Option<String>> {
    let start = std::time::Instant::now();
    let mut last = read_once()?;
    while start.elapsed() < PATIENCE {
        let next = read_once()?;
        if next == last {
            return Ok(Some(String::from_utf8_lossy(&next).into_owned()));
        }
        last = next;
        tokio::task::yield_now().await;
    }
    Ok(None)
}

/// One read of `/proc/locks` with a buffer large enough that each `read(2)` returns a whole
/// page (a small first read, as `read_to_end` makes, would add page breaks of its own).
fn read_once() -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open("/proc/locks")?;
    let mut text = Vec::with_capacity(64 * 1024);
    let mut page = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut page) {
            Ok(0) => return Ok(text),
            Ok(n) => text.extend_from_slice(&page[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// One `flock` lock granted on a file, as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlockEntry {
    pub(crate) pid: Option<u32>,
    pub(crate) mode: Mode,
}

/// The granted (not waiting) `FLOCK` entries of `text` (the contents of `/proc/locks`) for the
/// file on device `major:minor` with inode `ino`.
pub(crate) fn granted(text: &str, major: u32, minor: u32, ino: u64) -> Vec<FlockEntry> {
    text.lines()
        .filter_map(parse_line)
        .filter(|(dev, i, _)| *dev == (major, minor) && *i == ino)
        .map(|(_, _, e)| e)
        .collect()
}

/// The granted `FLOCK` entries of `text` on device `major:minor`, by inode: one read of the
/// table for a whole directory.
pub(crate) fn by_inode(text: &str, major: u32, minor: u32) -> HashMap<u64, Vec<FlockEntry>> {
    let mut out: HashMap<u64, Vec<FlockEntry>> = HashMap::new();
    for (dev, ino, entry) in text.lines().filter_map(parse_line) {
        if dev == (major, minor) {
            out.entry(ino).or_default().push(entry);
        }
    }
    out
}

/// One line of the table: a granted `FLOCK` lock's device, inode and entry.
fn parse_line(line: &str) -> Option<((u32, u32), u64, FlockEntry)> {
    let mut fields = line.split_whitespace();
    let _ordinal = fields.next();
    // `->` marks a waiter blocked in flock(2), not a holder.
    if fields.next()? != "FLOCK" {
        return None;
    }
    let _advisory = fields.next();
    let mode = match fields.next()? {
        "WRITE" => Mode::Write,
        "READ" => Mode::Read,
        _ => return None,
    };
    let pid = fields.next().and_then(|p| p.parse::<u32>().ok());
    let mut parts = fields.next()?.split(':');
    let major = u32::from_str_radix(parts.next()?, 16).ok()?;
    let minor = u32::from_str_radix(parts.next()?, 16).ok()?;
    let ino = parts.next()?.parse::<u64>().ok()?;
    Some(((major, minor), ino, FlockEntry { pid, mode }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_granted_flock_entries_of_one_file() {
        let text = "\
1: POSIX  ADVISORY  WRITE 3777 fe:00:770190 0 EOF
2: FLOCK  ADVISORY  WRITE 4242 fe:00:1234 0 EOF
2: -> FLOCK  ADVISORY  WRITE 4343 fe:00:1234 0 EOF
3: FLOCK  ADVISORY  READ 11 fe:00:1234 0 EOF
4: FLOCK  ADVISORY  READ 12 fe:00:1235 0 EOF
5: FLOCK  ADVISORY  READ 13 08:01:1234 0 EOF
6: OFDLCK ADVISORY  READ -1 fe:00:1234 0 EOF
";
        let got = granted(text, 0xfe, 0, 1234);
        assert_eq!(
            got,
            [
                FlockEntry {
                    pid: Some(4242),
                    mode: Mode::Write
                },
                FlockEntry {
                    pid: Some(11),
                    mode: Mode::Read
                },
            ]
        );
        assert!(granted("garbage\n\n1:\n", 0xfe, 0, 1234).is_empty());
        let all = by_inode(text, 0xfe, 0);
        assert_eq!(all[&1234], got);
        assert_eq!(all[&1235].len(), 1);
        assert_eq!(all.len(), 2, "{all:?}");
    }
}
