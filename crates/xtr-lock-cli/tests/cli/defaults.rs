//! One set of defaults: the ttl a command uses unless told is the library's (and a
//! configuration file's), `config show` prints what the commands use, and `none` and `forever`
//! mean on the command line what they mean in a file.

use std::time::Duration;

use xtr_lock_testkit::redis::RedisServer;

use crate::common::{flock_dsn, spawn, stderr_after_first_line, stop, wait_held, xtr};

/// `xtr-lock` without the caller's store or configuration in its environment.
fn bare() -> assert_cmd::Command {
    let mut cmd = xtr();
    cmd.env_remove("XTR_LOCK_STORE")
        .env_remove("XTR_LOCK_CONFIG");
    cmd
}

/// The ttl, in milliseconds (`None`: no expiry), that `run --json` with `args` took its lock
/// with, from its `acquired` event.
fn ttl_of_run(args: &[&str]) -> Option<u64> {
    let out = bare()
        .args(["run", "--json"])
        .args(args)
        .args(["r", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    let acquired: serde_json::Value = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .find(|e: &serde_json::Value| e["xtr_lock"] == "acquired")
        .unwrap_or_else(|| panic!("no acquired event: {stderr}"));
    acquired["ttl_ms"].as_u64()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap()
}

#[test]
fn the_default_ttl_is_the_librarys_and_none_means_no_expiry() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    assert_eq!(
        ttl_of_run(&["--store", &store]),
        Some(ms(xtr_lock::DEFAULT_TTL))
    );
    assert_eq!(
        ttl_of_run(&["--store", &store, "--ttl", "90"]),
        Some(90_000)
    );
    assert_eq!(ttl_of_run(&["--store", &store, "--ttl", "none"]), None);
    // Zero is not a spelling of none on the command line: the error says how to write it.
    let out = bare()
        .args(["run", "--store", &store, "--ttl", "0", "r", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--ttl none"),
        "{out:?}"
    );
}

/// `config show` prints, for each entry, the ttl and wait that `run --use ENTRY` uses: the
/// defaults where the file sets none (5m, forever), the file's where it does, `none` as none.
#[test]
fn config_show_prints_what_run_uses() {
    let tmp = tempfile::tempdir().unwrap();
    let dsn = flock_dsn(tmp.path());
    let file = tmp.path().join("locks.toml");
    std::fs::write(
        &file,
        format!(
            "[stores]\ndefault = \"{dsn}\"\nnone = {{ dsn = \"{dsn}\", ttl = \"none\" }}\n\
             short = {{ dsn = \"{dsn}\", ttl = \"90s\", wait = \"forever\" }}\n"
        ),
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let out = bare()
        .args(["config", "show", "--json", "--config", f])
        .output()
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (entry, from) in [
        ("default", "default"),
        ("none", "entry"),
        ("short", "entry"),
    ] {
        let said = &shown["entries"][entry];
        let used = ttl_of_run(&["--config", f, "--use", entry]);
        let said_ttl = match said["ttl"].as_str().unwrap() {
            "none" => None,
            text => Some(ms(humantime::parse_duration(text).unwrap())),
        };
        assert_eq!(said_ttl, used, "{entry}: config show says {said}");
        assert_eq!(said["from"]["ttl"], from, "{entry}: {said}");
        assert_eq!(said["wait"], "forever", "{entry}: {said}");
    }
    // The text form says the same, and where each value came from.
    let out = bare()
        .args(["config", "show", "--config", f])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ttl = \"5m\"  # default"), "{text}");
    assert!(text.contains("ttl = \"none\"  # entry"), "{text}");
    assert!(text.contains("wait = \"forever\"  # default"), "{text}");
}

/// With no configuration file, `config show` prints what commands use then (it used to refuse
/// with "no lock configuration to read"): the store of `$XTR_LOCK_STORE` (redacted) or flock,
/// the default ttl that `run` takes its lock with, and waiting forever.
#[test]
fn config_show_without_a_file_prints_the_defaults_run_uses() {
    let out = bare().args(["config", "show", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["stores"], serde_json::json!(["flock"]), "{shown}");
    assert_eq!(shown["wait"], "forever", "{shown}");
    let said = humantime::parse_duration(shown["ttl"].as_str().unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let used = ttl_of_run(&["--store", &flock_dsn(tmp.path())]);
    assert_eq!(Some(ms(said)), used, "{shown}");
    let out = bare()
        .args(["config", "show"])
        .env("XTR_LOCK_STORE", "redis://u:s3cret@127.0.0.1:1/0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text.contains("stores = [\"redis://u:***@127.0.0.1:1/0\"]  # $XTR_LOCK_STORE"),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
}

/// `-w forever` waits as long as it takes, as a file's `wait = "forever"`, and wins over a
/// file's shorter wait.
#[test]
fn wait_forever_waits_for_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let file = tmp.path().join("locks.toml");
    std::fs::write(
        &file,
        format!("wait = \"0\"\n[stores]\ndefault = \"{store}\"\n"),
    )
    .unwrap();
    let holder = spawn(&["run", "--store", &store, "w", "--", "sleep", "30"]);
    wait_held(&store, "w");
    let mut waiter = spawn(&[
        "run",
        "-v",
        "-w",
        "forever",
        "--config",
        file.to_str().unwrap(),
        "w",
        "--",
        "echo",
        "took it",
    ]);
    let (first, reader) = stderr_after_first_line(&mut waiter);
    assert!(first.contains("waiting for \"w\""), "{first}");
    stop(holder);
    let out = waiter.wait_with_output().unwrap();
    let stderr = reader.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "took it");
}

/// On Redis, where a lock needs a ttl: `acquire` and `refresh` give 5m unless told, and
/// `--ttl none` (or a file's `ttl = "none"`) is refused before anything is stored, saying why.
#[test]
fn redis_locks_get_the_default_ttl_and_none_is_refused() {
    let server = RedisServer::start();
    let store = server.url(0);
    let key = bare()
        .args(["acquire", "--store", &store, "k"])
        .output()
        .unwrap();
    assert!(key.status.success(), "{key:?}");
    let pttl = |name: &str| -> u64 { server.cli(&["PTTL", name]).trim().parse().unwrap() };
    let default = ms(xtr_lock::DEFAULT_TTL);
    assert!(
        pttl("k") > default - 30_000 && pttl("k") <= default,
        "{}",
        pttl("k")
    );
    server.cli(&["PEXPIRE", "k", "20000"]);
    bare()
        .args(["refresh", "--store", &store])
        .write_stdin(key.stdout)
        .assert()
        .success();
    assert!(pttl("k") > default - 30_000, "refresh gave {}", pttl("k"));

    let out = bare()
        .args(["run", "--store", &store, "--ttl", "none", "n", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "xtr-lock: error: --ttl is none, and the redis store's locks expire: give it a duration\n"
    );
    let file = config_with(&server, "ttl = \"none\"\n");
    let out = bare()
        .args([
            "run",
            "--config",
            file.path().to_str().unwrap(),
            "n",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the configuration file's ttl is none"),
        "{out:?}"
    );
    assert_eq!(server.cli(&["EXISTS", "n"]), "0");
}

/// A configuration file whose default entry is `server`'s Redis, with `top` at its top level.
fn config_with(server: &RedisServer, top: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let text = format!("{top}[stores]\ndefault = \"{}\"\n", server.url(0));
    std::fs::write(file.path(), text).unwrap();
    file
}
