//! A nested `xtr-lock` inside `run`'s command uses the store `run` used, wherever `run` took it
//! from: `--store` (one DSN or a quorum), `--config … --use …` (the entry, its prefix
//! included), not only `$XTR_LOCK_STORE`; a `--store` given to the nested call still wins.

use std::path::Path;

use xtr_lock_testkit::redis::RedisServer;

use crate::common::{bin, flock_dsn, xtr};

/// `xtr-lock` without the caller's store or configuration in its environment.
fn bare() -> assert_cmd::Command {
    let mut cmd = xtr();
    cmd.env_remove("XTR_LOCK_STORE")
        .env_remove("XTR_LOCK_CONFIG")
        .env_remove("XTR_LOCK_USE");
    cmd
}

/// A script for `sh -c`, with `xtr_lock` calling the binary under test: the nested `status` of
/// `resource`, then a nested `run -n` on it (`inner=1`: refused, the lock is seen held).
fn nested_script(resource: &str) -> String {
    format!(
        "xtr_lock() {{ {:?} \"$@\"; }}; xtr_lock status {resource} | head -1; \
         xtr_lock run -n {resource} -- echo TOOK-IT-AGAIN 2>/dev/null; echo inner=$?",
        bin().display()
    )
}

/// Runs `run ARGS nest:1 -- sh -c SCRIPT` and returns its stdout, failing on a non-zero exit.
fn run_nested(args: &[&str], extra_env: &[(&str, &str)]) -> String {
    let mut cmd = bare();
    cmd.arg("run")
        .args(args)
        .args(["nest:1", "--", "sh", "-c", &nested_script("nest:1")]);
    for (name, value) in extra_env {
        cmd.env(name, value);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn a_nested_call_uses_the_store_given_with_store() {
    let tmp = tempfile::tempdir().unwrap();
    // No server: a flock directory of its own, not the default one.
    let store = flock_dsn(tmp.path());
    let stdout = run_nested(&["--store", &store], &[]);
    assert!(stdout.starts_with("\"nest:1\": held by pid "), "{stdout}");
    assert!(stdout.ends_with("inner=1\n"), "{stdout}");
    assert!(!stdout.contains("TOOK-IT-AGAIN"), "{stdout}");

    // The report's case, on Redis.
    let server = RedisServer::start();
    let stdout = run_nested(&["--store", &server.url(0)], &[]);
    assert!(stdout.starts_with("\"nest:1\": held by "), "{stdout}");
    assert!(stdout.ends_with("inner=1\n"), "{stdout}");

    // A quorum given as repeated --store is passed on whole; so is its password.
    let other = RedisServer::start();
    let third = RedisServer::start_with(&["--requirepass", "pw-of-three"]);
    let with_pw = format!("redis://:pw-of-three@127.0.0.1:{}/0", third.port());
    let out = bare()
        .args(["run", "--store", &server.url(0), "--store", &other.url(0)])
        .args([
            "--store",
            &with_pw,
            "q",
            "--",
            "sh",
            "-c",
            "echo \"$XTR_LOCK_STORE\"",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{},{},{with_pw}\n", server.url(0), other.url(0))
    );
    let stdout = run_nested(
        &[
            "--store",
            &server.url(0),
            "--store",
            &other.url(0),
            "--store",
            &with_pw,
        ],
        &[],
    );
    assert!(stdout.ends_with("inner=1\n"), "{stdout}");
}

#[test]
fn a_store_given_to_the_nested_call_wins() {
    let (outer, inner) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let script = format!(
        "{:?} run -n --store {} nest:1 -- echo inner-store-free",
        bin().display(),
        flock_dsn(inner.path())
    );
    bare()
        .args(["run", "--store", &flock_dsn(outer.path()), "nest:1", "--"])
        .args(["sh", "-c", &script])
        .assert()
        .success()
        .stdout("inner-store-free\n");
}

fn write_config(dir: &Path, redis: &str) -> std::path::PathBuf {
    let path = dir.join("locks.toml");
    std::fs::write(
        &path,
        format!(
            "default = \"files\"\n[stores]\nfiles = \"flock://{dir}/default\"\n\
             mine = {{ dsn = \"flock://{dir}/mine\", prefix = \"m:\" }}\n\
             cache = {{ dsn = \"{redis}\", prefix = \"c:\" }}\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_nested_call_uses_the_entry_given_with_config_and_use() {
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let file = write_config(tmp.path(), &server.url(0));
    let f = file.to_str().unwrap();
    // A store in the caller's environment would win over a configuration file: it must not
    // reach the nested call.
    let elsewhere = tempfile::tempdir().unwrap();
    let env_store = flock_dsn(elsewhere.path());
    let caller_env = [("XTR_LOCK_STORE", env_store.as_str())];

    // No server: an entry that is not the file's default, with a prefix.
    let stdout = run_nested(&["--config", f, "--use", "mine"], &caller_env);
    assert!(stdout.starts_with("\"m:nest:1\": held by pid "), "{stdout}");
    assert!(stdout.ends_with("inner=1\n"), "{stdout}");

    // Redis, through --use and the file named by $XTR_LOCK_CONFIG.
    let config_env = [
        ("XTR_LOCK_STORE", env_store.as_str()),
        ("XTR_LOCK_CONFIG", f),
    ];
    let stdout = run_nested(&["--use", "cache"], &config_env);
    assert!(stdout.starts_with("\"c:nest:1\": held by "), "{stdout}");
    assert!(stdout.ends_with("inner=1\n"), "{stdout}");
    assert_eq!(server.cli(&["EXISTS", "c:nest:1"]), "0", "released after");
}

/// `$XTR_LOCK_RESOURCE` names the resource as the command line did: a nested call on the same
/// entry adds the entry's prefix itself (it used to get `m:nest:1` and look at `m:m:nest:1`,
/// free, and take it).
#[test]
fn the_resource_in_the_environment_is_named_as_the_nested_call_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_config(tmp.path(), "redis://127.0.0.1:1/0");
    let out = bare()
        .args(["run", "--config", file.to_str().unwrap(), "--use", "mine"])
        .args(["nest:1", "--", "sh", "-c"])
        .arg(nested_script("\"$XTR_LOCK_RESOURCE\""))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.starts_with("\"m:nest:1\": held by pid "), "{stdout}");
    assert!(stdout.ends_with("inner=1\n"), "{stdout}");
}

/// `refresh` without `--ttl` gives the lock the entry's ttl, as `config show` says (it used to
/// give 5m whatever the entry said).
#[test]
fn refresh_uses_the_entrys_ttl() {
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("locks.toml");
    std::fs::write(
        &file,
        format!(
            "[stores]\ndefault = {{ dsn = \"{}\", ttl = \"40s\" }}\n",
            server.url(0)
        ),
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let key = bare()
        .args(["acquire", "--config", f, "--ttl", "10s", "short"])
        .output()
        .unwrap();
    assert!(key.status.success(), "{key:?}");
    bare()
        .args(["refresh", "--config", f])
        .write_stdin(key.stdout)
        .assert()
        .success();
    let pttl: u64 = server.cli(&["PTTL", "short"]).trim().parse().unwrap();
    assert!(pttl > 30_000 && pttl <= 40_000, "PTTL {pttl}");
}
