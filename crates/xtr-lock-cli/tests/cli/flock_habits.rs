//! flock(1) habits: a section of a script locked on a descriptor the shell opened
//! (`exec 9>FILE; flock -n 9` as `exec 9>"$(xtr-lock path R)"; xtr-lock acquire --fd 9 -n R`),
//! `-F` refused saying what to use instead, a resource that starts with `-` after `--`.

use std::time::{Duration, Instant};

use predicates::prelude::*;

use crate::common::{bin, flock_dsn, wait_exit, xtr};

/// `sh -c` script that runs the binary under test as `xtr_lock`, on `store`.
fn with_xtr(store: &str, script: &str) -> String {
    format!(
        "xtr_lock() {{ {:?} \"$@\"; }}; export XTR_LOCK_STORE={store}; {script}",
        bin().display()
    )
}

/// Waits until `path` exists (a script says it got so far), failing after 10 s.
fn wait_for_file(path: &std::path::Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_script_locks_a_section_on_a_descriptor_it_opened() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let (locked, done, finish) = (
        tmp.path().join("locked"),
        tmp.path().join("done"),
        tmp.path().join("finish"),
    );
    // The section: locked on descriptor 9, held until the script closes it.
    let script = with_xtr(
        &store,
        &format!(
            "exec 9>\"$(xtr_lock path sect)\" || exit 9; xtr_lock acquire --fd 9 -n sect || exit 8; \
             touch {locked}; while [ ! -e {done} ]; do sleep 0.05; done; exec 9>&-; \
             while [ ! -e {finish} ]; do sleep 0.05; done",
            locked = locked.display(),
            done = done.display(),
            finish = finish.display()
        ),
    );
    let mut section = std::process::Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .unwrap();
    wait_for_file(&locked, "the script never locked its section");

    // Another process sees it held, through xtr-lock and flock(1) on the path it names.
    xtr()
        .args(["run", "-n", "--store", &store, "sect", "true"])
        .assert()
        .code(1);
    let path = String::from_utf8(
        xtr()
            .args(["path", "--store", &store, "sect"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        path.starts_with(&tmp.path().display().to_string()),
        "{path}"
    );
    let flock1 = std::process::Command::new("flock")
        .args(["-n", path.trim(), "true"])
        .status()
        .unwrap();
    assert_eq!(flock1.code(), Some(1), "flock(1) sees it held");
    // A second script's -n attempt on its own descriptor is refused, and -w gives up.
    let second = with_xtr(
        &store,
        "exec 7>\"$(xtr_lock path sect)\"; xtr_lock acquire --fd 7 -n sect; echo n=$?; \
         xtr_lock acquire --fd 7 -w 0.2 -E 5 sect; echo w=$?",
    );
    let out = std::process::Command::new("sh")
        .args(["-c", &second])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "n=1\nw=5\n");

    // Closing the descriptor ends the section: free at once, the script still running.
    std::fs::write(&done, b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !xtr()
        .args(["run", "-n", "--store", &store, "sect", "true"])
        .output()
        .unwrap()
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "the section's lock never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(section.try_wait().unwrap().is_none(), "the script goes on");
    std::fs::write(&finish, b"").unwrap();
    assert!(wait_exit(&mut section, "the script did not end").success());
}

#[test]
fn acquire_fd_refuses_a_descriptor_that_is_not_the_resources_lock_file() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            &with_xtr(
                &store,
                &format!(
                    "exec 9>{other}; xtr_lock acquire --fd 9 sect; echo other=$?; \
                     exec 9>&-; xtr_lock acquire --fd 9 sect; echo closed=$?; \
                     exec 9>\"$(xtr_lock path sect)\"; xtr_lock acquire --fd 9 -s sect; echo ok=$?",
                    other = tmp.path().join("other").display()
                ),
            ),
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(stdout, "other=2\nclosed=2\nok=0\n", "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with("xtr-lock: error: descriptor 9 is not the lock file of \"sect\""),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with("xtr-lock: error: descriptor 9 is not open"),
        "{stderr}"
    );
    // Only the flock store has a lock file to open.
    for args in [
        &["acquire", "--store", "in-memory", "--fd", "0", "x"][..],
        &["path", "--store", "in-memory", "x"][..],
    ] {
        xtr()
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("only the flock store"));
    }
}

#[test]
fn no_fork_is_refused_saying_what_to_use_instead() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("ran");
    let out = xtr()
        .args(["run", "-F", "--store", &flock_dsn(tmp.path()), "r", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("xtr-lock: error: -F/--no-fork ") && stderr.contains("acquire --fd"),
        "{stderr}"
    );
    assert!(!marker.exists());
}

#[test]
fn a_resource_that_starts_with_a_dash_goes_after_a_double_dash() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    xtr()
        .args(["run", "--store", &store, "--", "-x", "--", "sh", "-c"])
        .arg("echo \"$XTR_LOCK_RESOURCE\"")
        .assert()
        .success()
        .stdout("-x\n");
    // Without the second `--` the command follows the resource, as before.
    xtr()
        .args(["run", "--store", &store, "--", "-x", "echo", "ran"])
        .assert()
        .success()
        .stdout("ran\n");
}

/// A lock file removed while `acquire --fd` waits (a clean-up of the lock directory) is not
/// taken when its holder lets go: that lock would exclude nobody who opens the path now. The
/// waiter lets go and says so (it used to return 0, holding a lock on a file nobody else sees).
#[test]
fn acquire_fd_does_not_take_a_lock_file_removed_while_it_waited() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let path = String::from_utf8(
        xtr()
            .args(["path", "--store", &store, "gone"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let path = path.trim().to_owned();
    let (held, done) = (tmp.path().join("held"), tmp.path().join("done"));
    let mut holder = std::process::Command::new("flock")
        .args([
            &path,
            "sh",
            "-c",
            &format!(
                "touch {}; while [ ! -e {} ]; do sleep 0.02; done",
                held.display(),
                done.display()
            ),
        ])
        .spawn()
        .unwrap();
    wait_for_file(&held, "flock(1) never held the file");
    let waiter = std::process::Command::new("sh")
        .args([
            "-c",
            &with_xtr(
                &store,
                "exec 9>\"$(xtr_lock path gone)\"; xtr_lock acquire --fd 9 -w 20 gone",
            ),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the waiter holds its copy of descriptor 9 (two descriptors on the file), remove the
    // file, then let the holder go.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !acquire_holds_its_copy(&path) {
        assert!(
            Instant::now() < deadline,
            "acquire --fd never started waiting"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&done, b"").unwrap();
    assert!(wait_exit(&mut holder, "flock(1) did not end").success());
    let out = waiter.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.lines().count() == 1, "{stderr}");
}

/// Whether an `acquire --fd` process has its copy of the shell's descriptor on `path` (two
/// descriptors of its own on the file): it has started waiting, past its checks.
fn acquire_holds_its_copy(path: &str) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|p| {
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let is_acquire = String::from_utf8_lossy(&cmdline).contains("--fd");
        let on_path = std::fs::read_dir(p.path().join("fd")).map_or(0, |fds| {
            fds.flatten()
                .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.to_str() == Some(path)))
                .count()
        });
        is_acquire && on_path >= 2
    })
}
