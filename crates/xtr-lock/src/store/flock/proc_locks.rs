//! Who holds a lock file: the `FLOCK` entries of `/proc/locks` for its device and inode.

use crate::key::Mode;

/// One `flock` lock granted on a file, as the kernel lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlockEntry {
    pub(crate) pid: Option<u32>,
    pub(crate) mode: Mode,
}

/// The granted (not waiting) `FLOCK` entries of `text` (the contents of `/proc/locks`) for the
/// file on device `major:minor` with inode `ino`.
pub(crate) fn granted(text: &str, major: u32, minor: u32, ino: u64) -> Vec<FlockEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let _ordinal = fields.next();
        let mut kind = fields.next();
        if kind == Some("->") {
            continue; // a waiter blocked in flock(2), not a holder
        }
        if kind.take() != Some("FLOCK") {
            continue;
        }
        let _advisory = fields.next();
        let mode = match fields.next() {
            Some("WRITE") => Mode::Write,
            Some("READ") => Mode::Read,
            _ => continue,
        };
        let pid = fields.next().and_then(|p| p.parse::<u32>().ok());
        let Some(id) = fields.next() else { continue };
        let mut parts = id.split(':');
        let (Some(maj), Some(min), Some(inode)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let same = u32::from_str_radix(maj, 16).ok() == Some(major)
            && u32::from_str_radix(min, 16).ok() == Some(minor)
            && inode.parse::<u64>().ok() == Some(ino);
        if same {
            out.push(FlockEntry { pid, mode });
        }
    }
    out
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
    }
}
