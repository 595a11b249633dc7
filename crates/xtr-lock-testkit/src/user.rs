//! The unprivileged user that servers refusing root (PostgreSQL) and the multi-user tests run
//! as, made on first use when the tests run as root.

use std::process::Command;

/// The user's name: a system account without a home or a shell.
pub const USER: &str = "xtr-lock-test";

/// A user to run a process as.
#[derive(Debug, Clone, Copy)]
pub struct Account {
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

/// [`USER`] when the tests run as root (made with `useradd` if missing), `None` otherwise (the
/// tests' own user is unprivileged already).
///
/// # Panics
///
/// When running as root and the user cannot be made (`useradd`, package `passwd`).
pub fn unprivileged() -> Option<Account> {
    if !rustix::process::geteuid().is_root() {
        return None;
    }
    Some(ensure())
}

/// [`USER`], made with `useradd` if missing (root only).
///
/// # Panics
///
/// When the user is missing and cannot be made.
pub fn ensure() -> Account {
    let id = |flag: &str| -> Option<u32> {
        Command::new("id")
            .args([flag, USER])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
    };
    if id("-u").is_none() {
        let out = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ])
            .output()
            .expect("useradd (package passwd)");
        // Exit 9: another test made it meanwhile.
        assert!(
            out.status.success() || out.status.code() == Some(9),
            "useradd {USER}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Account {
        uid: id("-u").expect("the test user's uid"),
        gid: id("-g").expect("the test user's gid"),
    }
}
