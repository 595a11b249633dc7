//! `xtr-lock` with a lock configuration file: `config check` (exit codes, every problem named,
//! no credential), `config show` (redacted), `--config`/`--use`/`$XTR_LOCK_CONFIG` choosing the
//! store, the entry's prefix, wait and ttl, and `--store` winning over the environment.

use std::path::{Path, PathBuf};

use xtr_lock_testkit::postgres::PostgresServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::{spawn, stop, xtr};

/// `xtr-lock` without the caller's store or configuration in its environment.
fn bare() -> assert_cmd::Command {
    let mut cmd = xtr();
    cmd.env_remove("XTR_LOCK_STORE")
        .env_remove("XTR_LOCK_CONFIG")
        .env_remove("REDIS_PASSWORD");
    cmd
}

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("locks.toml");
    std::fs::write(&path, text).unwrap();
    path
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(cmd: &mut assert_cmd::Command) -> Out {
    let out = cmd.output().unwrap();
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn config_check_exit_codes_name_every_problem_and_never_a_credential() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        r#"
ttl = "soon"
default = "missing"
[stores]
files = "flock:///tmp/x"
cache = "redis://:${REDIS_PASSWORD}@127.0.0.1:1/0"
broken = "redis://:hunter2@[::1"
odd = "nosuchscheme://u:hunter2@h/"
"#,
    );
    let f = file.to_str().unwrap();
    let out = run(bare().args(["config", "check", "--config", f]));
    assert_eq!(out.code, Some(2), "{}{}", out.stdout, out.stderr);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 5, "{}", out.stderr);
    for needle in [
        "ttl: ",
        "default",
        "stores.cache: ${REDIS_PASSWORD} is not set",
        "stores.broken",
        "stores.odd",
    ] {
        assert!(
            out.stderr.contains(needle),
            "{needle:?} in:\n{}",
            out.stderr
        );
    }
    assert!(lines.iter().all(|l| l.starts_with("xtr-lock: ")));
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);

    // JSON for machines: the same problems, on stdout.
    let out = run(bare().args(["config", "check", "--json", "--config", f]));
    assert_eq!(out.code, Some(2));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["problems"].as_array().unwrap().len(), 5);
    assert!(!out.stdout.contains("hunter2"));

    // Not TOML: the line, never the text.
    let bad = write(tmp.path(), "[stores]\ndefault = \"redis://:hunter2@h\n");
    let out = run(bare().args(["config", "check", "--config", bad.to_str().unwrap()]));
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("line 2"), "{}", out.stderr);
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);

    // No configuration at all is a usage error, not a silent pass.
    let out = run(bare().args(["config", "check"]));
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr
            .contains("give --config FILE or set $XTR_LOCK_CONFIG"),
        "{}",
        out.stderr
    );

    // Sound, from the environment variable.
    let good = write(
        tmp.path(),
        "[stores]\ndefault = \"flock\"\ncache = \"redis://:${REDIS_PASSWORD}@127.0.0.1:1/0\"\n",
    );
    let out = run(bare()
        .args(["config", "check"])
        .env("XTR_LOCK_CONFIG", &good)
        .env("REDIS_PASSWORD", "hunter2"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("2 entries, default \"default\": sound"),
        "{}",
        out.stdout
    );
}

#[test]
fn config_check_ping_reaches_every_store_and_exits_69_when_one_is_down() {
    let up = RedisServer::start();
    let mut down = RedisServer::start();
    down.kill();
    let tmp = tempfile::tempdir().unwrap();
    let up_only = write(
        tmp.path(),
        &format!(
            "[stores]\ndefault = \"flock://{}\"\ncache = \"{}\"\n",
            tmp.path().display(),
            up.url(0)
        ),
    );
    let out = run(bare().args([
        "config",
        "check",
        "--ping",
        "--config",
        up_only.to_str().unwrap(),
    ]));
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("2 of 2 reached"), "{}", out.stdout);

    let with_down = write(
        tmp.path(),
        &format!(
            "[stores]\ndefault = \"{}\"\ndown = \"{}\"\n",
            up.url(0),
            down.url(0).replace("redis://", "redis://:hunter2@")
        ),
    );
    let out = run(bare().args([
        "config",
        "check",
        "--ping",
        "--timeout",
        "2s",
        "--json",
        "--config",
        with_down.to_str().unwrap(),
    ]));
    assert_eq!(out.code, Some(69), "{}{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["entries"]["default"]["reached"], true);
    assert_eq!(v["entries"]["down"]["reached"], false);
    assert!(!out.stdout.contains("hunter2"), "{}", out.stdout);
}

/// `--timeout` bounds the whole check: a store that does not answer (a paused database, whose
/// connect timeout is longer) is reported as unreached at the timeout, and the check exits.
#[test]
fn config_check_ping_honours_its_timeout_against_a_silent_database() {
    let server = PostgresServer::start();
    server.pause();
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        &format!(
            "[stores]\ndefault = \"{}?connect_timeout=10\"\n",
            server.url()
        ),
    );
    let started = std::time::Instant::now();
    let out = run(bare().args([
        "config",
        "check",
        "--ping",
        "--timeout",
        "2s",
        "--config",
        file.to_str().unwrap(),
    ]));
    let took = started.elapsed();
    server.resume();
    assert_eq!(out.code, Some(69), "{}{}", out.stdout, out.stderr);
    assert!(
        took < std::time::Duration::from_secs(6),
        "config check --ping --timeout 2s took {took:?}"
    );
}

#[test]
fn config_show_prints_what_was_checked_with_credentials_redacted() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        r#"
prefix = "billing:"
ttl = 90
[stores]
default = "flock"
cache = { dsn = "redis://:${REDIS_PASSWORD}@cache:6379/0", wait = "30s" }
quorum = { dsns = ["redis://a:6379", "redis://b:6379", "redis://c:6379"], strategy = "unanimous" }
"#,
    );
    let out = run(bare()
        .args(["config", "show", "--config", file.to_str().unwrap()])
        .env("REDIS_PASSWORD", "hunter2"));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(!out.stdout.contains("hunter2"), "{}", out.stdout);
    for needle in [
        "[stores.\"cache\"]\ndsn = \"redis://:***@cache:6379/0\"\nprefix = \"billing:\"  # file\nttl = \"1m 30s\"  # file\nwait = \"30s\"  # entry",
        "strategy = \"unanimous\"",
        "[stores.\"default\"]\ndsn = \"flock\"",
        "wait = \"forever\"",
    ] {
        assert!(
            out.stdout.contains(needle),
            "{needle:?} in:\n{}",
            out.stdout
        );
    }
    let out = run(bare()
        .args([
            "config",
            "show",
            "--json",
            "--config",
            file.to_str().unwrap(),
        ])
        .env("REDIS_PASSWORD", "hunter2"));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        v["entries"]["cache"]["stores"][0],
        "redis://:***@cache:6379/0"
    );
    assert_eq!(v["entries"]["quorum"]["strategy"], "unanimous");
}

#[test]
fn commands_use_the_entry_its_prefix_and_wait() {
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        &format!(
            "prefix = \"app:\"\nwait = \"0\"\ndefault = \"files\"\n[stores]\n\
             files = \"flock://{}\"\ncache = {{ dsn = \"{}\", prefix = \"c:\", ttl = \"7s\" }}\n\
             other = \"redis://:${{UNSET_FOR_THIS_TEST}}@127.0.0.1:1/0\"\n",
            tmp.path().display(),
            server.url(0)
        ),
    );
    let f = file.to_str().unwrap();
    // The resource as named (nested calls add the prefix), then where the lock lives: with it.
    let env = "echo $XTR_LOCK_RESOURCE $XTR_LOCK_SCHEME $XTR_LOCK_LOCATION";

    // The default entry, with the top-level prefix; another entry's unset variable does not
    // stop a command that does not use it.
    let out = run(bare().args(["run", "--config", f, "job", "--", "sh", "-c", env]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.starts_with("job flock "), "{}", out.stdout);
    assert!(out.stdout.contains("xtr.app-job."), "{}", out.stdout);

    // --use picks an entry, with its own prefix; $XTR_LOCK_CONFIG is read without --config.
    let out = run(bare()
        .args(["run", "--use", "cache", "job", "--", "sh", "-c", env])
        .env("XTR_LOCK_CONFIG", &file));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout
            .starts_with("job redis key \"c:job\" in redis://"),
        "{}",
        out.stdout
    );

    the_entrys_ttl_is_on_the_server(&server, f);
    the_files_wait_holds_unless_the_command_line_says(f);
    store_and_config_choices(&file, env);
}

/// The entry's ttl (`cache`'s 7 s): a lock taken with acquire has it on the server.
fn the_entrys_ttl_is_on_the_server(server: &RedisServer, f: &str) {
    let out = run(bare().args(["acquire", "--config", f, "--use", "cache", "held"]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let key = out.stdout.trim().to_owned();
    let ttl: i64 = server.cli(&["PTTL", "c:held"]).trim().parse().unwrap_or(-9);
    assert!((1..=7000).contains(&ttl), "pttl {ttl}");
    let out = run(bare()
        .args(["release", "--config", f, "--use", "cache", "-"])
        .write_stdin(key));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
}

/// The file's wait ("0"): a held lock is a conflict at once; -w on the command line wins.
fn the_files_wait_holds_unless_the_command_line_says(f: &str) {
    let holder = spawn(&["run", "--config", f, "busy", "--", "sleep", "30"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while run(bare().args(["status", "--config", f, "busy"])).code != Some(0) {
        assert!(std::time::Instant::now() < deadline, "never held");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let started = std::time::Instant::now();
    let out = run(bare().args(["run", "--config", f, "busy", "true"]));
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let out = run(bare().args(["run", "--config", f, "-w", "0.3", "busy", "true"]));
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    stop(holder);
}

/// --store wins over $XTR_LOCK_CONFIG; --store with --config is refused by the parser; an entry
/// that is not there, or --use without a file, is named.
fn store_and_config_choices(file: &Path, env: &str) {
    let f = file.to_str().unwrap();
    let out = run(bare()
        .args([
            "run",
            "--store",
            "in-memory",
            "-q",
            "job",
            "--",
            "sh",
            "-c",
            env,
        ])
        .env("XTR_LOCK_CONFIG", file));
    assert!(out.stdout.starts_with("job in-memory"), "{}", out.stderr);
    let out = run(bare().args(["run", "--store", "flock", "--config", f, "job", "true"]));
    assert_eq!(out.code, Some(2));
    let out = run(bare().args(["run", "--config", f, "--use", "nope", "job", "true"]));
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr
            .contains("no entry \"nope\" (its entries: cache, files, other)"),
        "{}",
        out.stderr
    );
    let out = run(bare().args(["run", "--use", "cache", "job", "true"]));
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("give --config FILE"), "{}", out.stderr);
}
