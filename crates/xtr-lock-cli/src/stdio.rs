//! Whether the caller closed stdout (`xtr-lock acquire … >&-`).
//!
//! The standard library opens `/dev/null` read-write on each of descriptors 0, 1, 2 that is
//! closed when the process starts (so a file or socket opened later cannot take the number),
//! and writes to it then succeed: a key printed "to stdout" would reach nobody and its lock
//! would stay held. A shell's `> /dev/null` opens it write-only, so read-write `/dev/null` on
//! descriptor 1 is what a closed stdout looks like, and `acquire` refuses it before it takes a
//! lock nobody could be handed.

use std::os::fd::AsFd as _;

/// Whether descriptor 1 is `/dev/null` opened read-write: closed when the process started.
pub(crate) fn stdout_closed() -> bool {
    let stdout = std::io::stdout();
    let fd = stdout.as_fd();
    let (Ok(st), Ok(null)) = (rustix::fs::fstat(fd), rustix::fs::stat("/dev/null")) else {
        return false;
    };
    let same_device = rustix::fs::FileType::from_raw_mode(st.st_mode).is_char_device()
        && st.st_rdev == null.st_rdev;
    let read_write = rustix::fs::fcntl_getfl(fd)
        .is_ok_and(|flags| flags & rustix::fs::OFlags::ACCMODE == rustix::fs::OFlags::RDWR);
    same_device && read_write
}
