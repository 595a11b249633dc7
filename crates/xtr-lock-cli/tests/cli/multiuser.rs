//! Locks shared between users on one machine: a directory root made for them is accepted when
//! nobody else could swap its lock files, and the users then exclude each other (and flock(1)
//! users of the same files); an unsafe directory is refused, saying which rule failed.
//!
//! Needs root, to create the second user and to run as it: CI runs as root. Without root the
//! test fails saying so; it is never skipped.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{bin, flock_dsn, spawn, stop, wait_held, xtr};

/// The second user's uid and gid, created when missing.
fn second_user() -> (u32, u32) {
    assert!(
        rustix::process::getuid().is_root(),
        "this test creates a second user and runs xtr-lock as it: run the suite as root (CI does)"
    );
    let account = xtr_lock_testkit::user::ensure();
    (account.uid, account.gid)
}

/// A copy of the binary under test that the second user can run, whatever the permissions on
/// the way to the build directory.
fn public_binary(dir: &Path) -> PathBuf {
    let copy = dir.join("xtr-lock");
    std::fs::copy(bin(), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

fn as_user(user: (u32, u32), program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .uid(user.0)
        .gid(user.1)
        .env_remove("XTR_LOCK_STORE")
        .env("TMPDIR", "/tmp")
        .current_dir("/")
        .output()
        .unwrap()
}

#[test]
fn users_share_locks_in_a_directory_root_made_for_them() {
    let user = second_user();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = public_binary(tmp.path());
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    // Root's, writable by everyone and sticky: /tmp's rules.
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let store = flock_dsn(&shared);

    // Root holds: the other user is refused, sees the holder, and so does flock(1) as that user.
    let run = spawn(&["run", "--store", &store, "shared", "--", "sleep", "30"]);
    wait_held(&store, "shared");
    let out = as_user(
        user,
        &exe,
        &["run", "-n", "--store", &store, "shared", "true"],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "the other user must see root's lock: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = as_user(user, &exe, &["status", "--store", &store, "shared"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout
        .lines()
        .find_map(|l| l.strip_prefix("lock: "))
        .expect("the lock file")
        .to_owned();
    let out = as_user(user, Path::new("/usr/bin/flock"), &["-n", &path, "true"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "flock(1) as the other user: {out:?}"
    );
    stop(run);

    // The other user holds: root is refused.
    let mut held = Command::new(&exe);
    held.args(["run", "--store", &store, "shared", "--", "sleep", "30"])
        .uid(user.0)
        .gid(user.1)
        .current_dir("/");
    let held = held.spawn().unwrap();
    wait_held(&store, "shared");
    xtr()
        .args(["run", "-n", "--store", &store, "shared", "true"])
        .assert()
        .code(1);
    stop(held);

    // Each user's default directory stays their own (Python xtr-lock's rule): no sharing there.
    let out = as_user(user, &exe, &["status", "default-dir"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("/tmp/xtr-lock-{}/", user.0)),
        "{stdout} {out:?}"
    );
}

#[test]
fn unsafe_shared_directories_are_refused_saying_which_rule_failed() {
    let user = second_user();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    xtr()
        .args(["run", "--store", &flock_dsn(&open), "r", "true"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "is writable by every user and not sticky (mode 777), so anyone could replace its \
             lock files",
        ));

    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    rustix::fs::chown(
        &theirs,
        Some(rustix::process::Uid::from_raw(user.0)),
        Some(rustix::process::Gid::from_raw(user.1)),
    )
    .unwrap();
    xtr()
        .args(["run", "--store", &flock_dsn(&theirs), "r", "true"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(format!(
            "it belongs to user {}, neither this user (0) nor root",
            user.0
        )));
}
