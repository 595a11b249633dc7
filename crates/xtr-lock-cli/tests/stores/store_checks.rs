//! The stores' pre-flight check from the command line: `config check --ping` prints each
//! store's warnings naming the entry and the store (exit status unchanged, notes with `-v`,
//! `--json` too); `run -v` and `acquire -v` say them once on stderr.

use std::path::{Path, PathBuf};

use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::xtr;

/// `xtr-lock` without the caller's store or configuration in its environment.
fn bare() -> assert_cmd::Command {
    let mut cmd = xtr();
    cmd.env_remove("XTR_LOCK_STORE")
        .env_remove("XTR_LOCK_CONFIG");
    cmd
}

fn evicting_redis() -> RedisServer {
    RedisServer::start_with(&[
        "--requirepass",
        "hunter2",
        "--maxmemory",
        "100mb",
        "--maxmemory-policy",
        "allkeys-lru",
    ])
}

fn dsn(server: &RedisServer) -> String {
    format!("redis://:hunter2@127.0.0.1:{}/0", server.port())
}

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("locks.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn output(cmd: &mut assert_cmd::Command) -> (Option<i32>, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn config_check_ping_prints_each_stores_warnings_and_exits_0() {
    let redis = evicting_redis();
    let quiet = RedisServer::start();
    let memcached = MemcachedServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        &format!(
            "[stores]\ndefault = \"{}\"\ncache = \"{}\"\nplain = \"{}\"\n",
            dsn(&redis),
            memcached.url(),
            quiet.url(0)
        ),
    );
    let file = file.to_str().unwrap();
    let (code, stdout, stderr) =
        output(bare().args(["config", "check", "--ping", "--config", file]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains("hunter2"), "{stdout}");
    let line = |entry: &str, needle: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(entry) && l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} line for {entry}: {stdout}"))
            .to_owned()
    };
    let redis_line = line("default", "warning: ");
    assert!(
        redis_line.contains(&format!("redis://127.0.0.1:{}/0", redis.port())),
        "{redis_line}"
    );
    assert!(redis_line.contains("allkeys-lru"), "{redis_line}");
    assert!(line("cache", "warning: ").contains("-M"), "{stdout}");
    assert!(stdout.contains(", 2 warnings"), "{stdout}");
    // Notes (no persistence on the testkit's servers) only with -v.
    assert!(!stdout.contains("note: "), "{stdout}");
    let (code, stdout, _) =
        output(bare().args(["config", "check", "--ping", "-v", "--config", file]));
    assert_eq!(code, Some(0));
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("plain") && l.contains("note: ")),
        "{stdout}"
    );

    let (code, stdout, _) =
        output(bare().args(["config", "check", "--ping", "--json", "--config", file]));
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["ok"], true);
    let w = &v["entries"]["default"]["warnings"][0];
    assert_eq!(w["code"], "eviction");
    assert_eq!(w["severity"], "warning");
    assert_eq!(v["entries"]["plain"]["warnings"], serde_json::json!([]));
    assert!(!stdout.contains("hunter2"), "{stdout}");
}

#[test]
fn run_v_says_the_stores_warnings_once_and_without_v_nothing() {
    let redis = evicting_redis();
    let store = dsn(&redis);
    let (code, _, stderr) =
        output(bare().args(["run", "-v", "--store", &store, "check-run", "--", "true"]));
    assert_eq!(code, Some(0), "{stderr}");
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("xtr-lock: warning: "))
        .collect();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert!(warned[0].contains("allkeys-lru"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    let (code, _, stderr) =
        output(bare().args(["run", "--store", &store, "check-run", "--", "true"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("allkeys-lru"), "{stderr}");
}

#[test]
fn acquire_v_says_the_stores_warnings() {
    let memcached = MemcachedServer::start();
    let (code, stdout, stderr) = output(bare().args([
        "acquire",
        "-v",
        "--store",
        &memcached.url(),
        "check-acquire",
    ]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("xtr-lock: warning: ") && l.contains("-M")),
        "{stderr}"
    );
}
