//! Holder metadata from the command line (`run`, `acquire`, `--meta`), shown by `status` and
//! `list`: capped, and never carrying a credential.

use xtr_lock_testkit::redis::RedisServer;

use crate::common::{flock_dsn, run_holding, stop, xtr};

/// `list --json` on `store` (a store that lists: exit 0).
fn list_json(store: &str, prefix: &str) -> serde_json::Value {
    let out = xtr()
        .args(["list", "--json", "--store", store, prefix])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A store that cannot enumerate its locks says so in one line, exit 2.
#[test]
fn list_on_a_store_that_cannot_list_says_why_in_one_line() {
    let out = xtr()
        .args(["list", "--store", "semaphore", "job-"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("cannot list"), "{err}");
}

#[test]
fn meta_over_the_cap_is_one_line_naming_it() {
    let big = format!("note={}", "x".repeat(1100));
    for cmd in [
        &["run", "--meta", &big, "r", "--", "true"][..],
        &["acquire", "--meta", &big, "r"],
    ] {
        let out = xtr().args(cmd).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("at most 1024 bytes"), "{err}");
    }
    let out = xtr()
        .args(["run", "--meta", "novalue", "r", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn no_password_reaches_the_metadata() {
    let server = RedisServer::start();
    let url = server.url(0);
    let store = url.replacen("redis://", "redis://:secret@", 1);
    server.cli(&["CONFIG", "SET", "requirepass", "secret"]);
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pid");
    let script = format!(
        // The secrets are the script's arguments: `sleep` itself must keep running.
        "echo $$ > {}; exec sleep 60",
        pidfile.display()
    );
    let mut run = crate::common::spawn(&[
        "run",
        "--json",
        "--meta",
        "role=primary",
        "--store",
        &store,
        "meta-r",
        "--",
        "sh",
        "-c",
        &script,
        "sh",
        "postgres://u:pw@h/db",
        "--password=hunter2",
    ]);
    let (first, rest) = crate::common::stderr_after_first_line(&mut run);
    let acquired: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(acquired["xtr_lock"], "acquired", "{first}");
    let meta = acquired["meta"].to_string();
    crate::common::command_pid(&pidfile);
    let mut shown = vec![meta.clone()];
    let status = xtr()
        .args(["status", "--json", "--store", &store, "meta-r"])
        .output()
        .unwrap();
    shown.push(String::from_utf8_lossy(&status.stdout).into_owned());
    let listed = list_json(&store, "meta-");
    assert_eq!(listed[0]["resource"], "meta-r", "{listed}");
    assert_eq!(
        listed[0]["holders"][0]["meta"]["role"], "primary",
        "{listed}"
    );
    shown.push(listed.to_string());
    stop(run);
    let _ = rest.join();
    assert_eq!(acquired["meta"]["role"], "primary", "{meta}");
    assert!(acquired["meta"]["host"].is_string(), "{meta}");
    let cmd = acquired["meta"]["cmd"].as_str().unwrap_or_default();
    assert!(cmd.starts_with("sh -c echo"), "{meta}");
    assert!(cmd.contains("postgres://u:***@h/db"), "{meta}");
    for text in &shown {
        for secret in ["secret", "u:pw@", "hunter2"] {
            assert!(!text.contains(secret), "{secret} shown: {text}");
        }
    }
}

#[test]
fn status_and_list_show_the_holders_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let store = flock_dsn(dir.path());
    let pidfile = dir.path().join("pid");
    let (run, _) = run_holding(
        &[
            "run",
            "--store",
            &store,
            "--meta",
            "job=nightly",
            "meta-flock",
        ],
        &pidfile,
    );
    let out = xtr()
        .args(["status", "--store", &store, "meta-flock"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let listed = list_json(&store, "meta-");
    let plain = xtr().args(["list", "--store", &store]).output().unwrap();
    stop(run);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("held by pid"), "{text}");
    assert!(text.contains("\"job\":\"nightly\""), "{text}");
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(
        listed[0]["holders"][0]["meta"]["job"], "nightly",
        "{listed}"
    );
    let plain = String::from_utf8_lossy(&plain.stdout);
    assert!(plain.starts_with("meta-flock\twrite\tpid "), "{plain}");
    let empty = xtr().args(["list", "--store", &store]).output().unwrap();
    assert_eq!(empty.status.code(), Some(0));
    assert!(empty.stdout.is_empty(), "nothing held prints nothing");
}
