//! `xtr-lock` as a drop-in for flock(1) and `consul lock`: nested calls, keys that name their
//! store, one-line errors, scriptable status, flock(1)'s options, JSON events, quorums from the
//! environment, checked DSNs.

use std::time::{Duration, Instant};

use predicates::prelude::*;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::{bin, flock_dsn, spawn, stderr_after_first_line, stop, wait_held, xtr};

/// `sh -c` script that runs the binary under test as `xtr-lock`.
fn with_xtr(script: &str) -> String {
    format!("xtr_lock() {{ {:?} \"$@\"; }}; {script}", bin().display())
}

// ---- the command's environment -------------------------------------------------------------------

#[test]
fn nested_calls_see_the_callers_store() {
    let server = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    for store in [server.url(0), flock_dsn(tmp.path())] {
        let out = xtr()
            .args(["run", "nest", "--", "sh", "-c"])
            .arg(with_xtr(
                "echo \"store=$XTR_LOCK_STORE\"; xtr_lock status nest >/dev/null; echo status=$?; \
                 xtr_lock run -n nest true 2>/dev/null; echo inner=$?",
            ))
            .env("XTR_LOCK_STORE", &store)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{store}: {stdout} {out:?}");
        assert_eq!(
            stdout,
            format!("store={store}\nstatus=0\ninner=1\n"),
            "{store}: the command sees the caller's XTR_LOCK_STORE; the inner status sees the \
             lock held, the inner run -n is refused"
        );
    }
}

// ---- keys name their store ---------------------------------------------------------------------

#[test]
fn a_key_names_its_store_and_fencing_token() {
    let server = RedisServer::start();
    let store = server.url(0);
    let other = RedisServer::start();
    // The --help example, as a script: the key alone says where to release it.
    let out = xtr()
        .args(["acquire", "--store", &store, "--ttl", "10m", "job:7"])
        .env_remove("XTR_LOCK_STORE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let key = String::from_utf8(out.stdout).unwrap();
    let json: serde_json::Value = serde_json::from_str(&key).unwrap();
    assert_eq!(json["store"], serde_json::json!([store]));
    assert_eq!(json["mode"], "write");
    assert!(json["fencing_token"].as_u64().unwrap() > 0, "{json}");
    assert!(!key.contains("secret"));
    xtr()
        .args(["status", "--key", "-"])
        .env_remove("XTR_LOCK_STORE")
        .write_stdin(key.clone())
        .assert()
        .code(0)
        .stdout(predicate::str::starts_with(
            "\"job:7\": held by this key (write, fencing token ",
        ));
    xtr()
        .args(["refresh", "--ttl", "20m", key.trim()])
        .env_remove("XTR_LOCK_STORE")
        .assert()
        .success();
    // A --store naming another server is refused, naming both; the lock stays held.
    xtr()
        .args(["release", "--store", &other.url(0), "-"])
        .write_stdin(key.clone())
        .assert()
        .code(2)
        .stderr(format!(
            "xtr-lock: error: the key was made on {store}, not on the store --store names ({}); \
             leave --store out to use the key's own\n",
            other.url(0)
        ));
    assert_eq!(server.cli(&["EXISTS", "job:7"]), "1");
    // An unrelated XTR_LOCK_STORE (a flock default, say) does not stop the key's own store.
    xtr()
        .args(["release", "-"])
        .env("XTR_LOCK_STORE", "flock")
        .write_stdin(key.clone())
        .assert()
        .success();
    assert_eq!(server.cli(&["EXISTS", "job:7"]), "0");
    xtr().args(["refresh", key.trim()]).assert().code(3).stderr(
        "xtr-lock: \"job:7\" is not held by this key (its lock expired, was released, or \
             was never taken)\n",
    );
}

#[test]
fn a_password_stays_out_of_the_key_and_comes_from_the_matching_store() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret-pw"]);
    let with_pw = format!("redis://:s3cret-pw@127.0.0.1:{}/0", server.port());
    let out = xtr()
        .args(["acquire", "--store", &with_pw, "pw"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let key = String::from_utf8(out.stdout).unwrap();
    assert!(!key.contains("s3cret"), "{key}");
    // The environment names the same server with the password: used for the key.
    xtr()
        .args(["release", "-"])
        .env("XTR_LOCK_STORE", &with_pw)
        .write_stdin(key.clone())
        .assert()
        .success();
}

#[test]
fn a_keys_store_keeps_the_prefix_and_database() {
    let server = RedisServer::start();
    let store = format!("{}?prefix=app%3Alocks%3A&socket_timeout=2", server.url(3));
    let out = xtr()
        .args(["acquire", "--store", &store, "p"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let key: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        key["store"],
        serde_json::json!([format!("{}?prefix=app%3Alocks%3A", server.url(3))])
    );
    assert_eq!(server.cli(&["-n", "3", "EXISTS", "app:locks:p"]), "1");
    // The same store with other timeouts is the same store.
    xtr()
        .args(["release", "--store", &store, "-"])
        .write_stdin(out.stdout.clone())
        .assert()
        .success();
    assert_eq!(server.cli(&["-n", "3", "EXISTS", "app:locks:p"]), "0");
}

// ---- errors ----------------------------------------------------------------------------------

#[test]
fn errors_are_one_line_with_each_cause_once() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.kill();
    let out = xtr()
        .args([
            "run",
            "--store",
            &format!("redis://127.0.0.1:{port}/0"),
            "r",
            "true",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr,
        format!(
            "xtr-lock: error: lock 'r': failed to acquire the lock: cannot reach the Redis \
             server: Connection refused (os error 111) (store redis://127.0.0.1:{port}/0)\n"
        )
    );
}

#[test]
fn a_failed_release_in_run_says_why() {
    let server = RedisServer::start();
    let pid = server.pid().as_raw_nonzero();
    let port = server.port();
    // The command kills the server and ends once it refuses connections (a zombie until the
    // test reaps it, but its sockets are closed): the release after it fails, and says why.
    let out = xtr()
        .args(["run", "--store", &server.url(0), "r", "--", "sh", "-c"])
        .arg(format!(
            "kill -9 {pid}; while redis-cli -p {port} PING >/dev/null 2>&1; do sleep 0.01; done"
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("xtr-lock: error: lock 'r': failed to release the lock: ")
            && stderr.contains("(store redis://127.0.0.1:")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
}

// ---- status ----------------------------------------------------------------------------------

#[test]
fn status_exit_codes_and_the_lock_file_flock_1_can_use() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let out = xtr()
        .args(["status", "--store", &store, "st"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "free is exit 1");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let path = stdout
        .lines()
        .find_map(|l| l.strip_prefix("lock: "))
        .unwrap_or_else(|| panic!("no lock file in {stdout:?}"))
        .to_owned();
    assert!(
        path.starts_with(&tmp.path().display().to_string()),
        "{path}"
    );
    let run = spawn(&["run", "--store", &store, "st", "--", "sleep", "30"]);
    wait_held(&store, "st");
    xtr()
        .args(["status", "--store", &store, "st"])
        .assert()
        .code(0);
    // flock(1) on the file status names is the same lock.
    let held = std::process::Command::new("flock")
        .args(["-n", &path, "true"])
        .status()
        .unwrap();
    assert_eq!(held.code(), Some(1), "flock(1) on {path} must see the lock");
    let json = xtr()
        .args(["status", "--json", "--store", &store, "st"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["location"].as_str()),
        (Some("held"), Some(path.as_str()))
    );
    stop(run);
    // An error is 2, and so is a store that cannot tell.
    xtr()
        .args(["status", "--store", "redis://127.0.0.1:1/0", "st"])
        .assert()
        .code(2);
    xtr()
        .args(["status", "--store", "null", "st"])
        .assert()
        .code(2)
        .stdout("\"st\": the null store cannot tell who holds a lock\n");
}

#[test]
fn redis_status_does_not_pass_the_stores_counter_off_as_the_resources() {
    let server = RedisServer::start();
    let store = server.url(0);
    xtr()
        .args(["run", "--store", &store, "other", "true"])
        .assert()
        .success();
    // Free: nothing about tokens, which belong to holders.
    xtr()
        .args(["status", "--store", &store, "free-one"])
        .assert()
        .code(1)
        .stdout(format!(
            "\"free-one\": free\nlock: key \"free-one\" in {store}\n"
        ));
}

// ---- flock(1)'s options ----------------------------------------------------------------------

#[test]
fn flock_1_options_work_as_flock_users_type_them() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    // The command after the resource without `--`, its own options untouched; -c; -x; -e.
    xtr()
        .args(["run", "--store", &store, "f", "printf", "%s-%s", "-n", "x"])
        .assert()
        .success()
        .stdout("-n-x");
    xtr()
        .args([
            "run",
            "--store",
            &store,
            "-x",
            "f",
            "-c",
            "echo $XTR_LOCK_MODE",
        ])
        .assert()
        .success()
        .stdout("write\n");
    xtr()
        .args(["run", "--store", &store, "-e", "--nb", "f", "true"])
        .assert()
        .success();
    let run = spawn(&["run", "--store", &store, "f", "--", "sleep", "30"]);
    wait_held(&store, "f");
    // -w in seconds, fractions too, and --timeout as flock(1) spells it.
    for wait in [["-w", "0.3"], ["--timeout", "0.2"], ["-w", "1"]] {
        let t = Instant::now();
        xtr()
            .args(["run", "--store", &store])
            .args(wait)
            .args(["f", "true"])
            .assert()
            .code(1)
            .stderr(predicate::str::contains(
                "is still held by someone else after",
            ));
        assert!(t.elapsed() >= Duration::from_millis(200), "{wait:?} waited");
    }
    // -v says that it waits and how long getting the lock took, with no terminal in sight.
    let mut waiter = spawn(&["run", "-v", "--store", &store, "f", "echo", "ran"]);
    // Released only once the waiter said it waits.
    let (_, reader) = stderr_after_first_line(&mut waiter);
    stop(run);
    let status = waiter.wait().unwrap();
    let stderr = reader.join().unwrap();
    assert!(status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines[0].starts_with("xtr-lock: waiting for \"f\"; held by pid "),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with("xtr-lock: getting lock \"f\" took ")
            && lines[1].ends_with(" seconds (write)"),
        "{stderr}"
    );
    assert_eq!(lines[2], "xtr-lock: executing echo ran");
    // -u has nothing to unlock here: a clear refusal.
    xtr()
        .args(["run", "-u", "--store", &store, "f", "true"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "-u/--unlock drops a lock held on a descriptor",
        ));
}

#[test]
fn close_keeps_the_lock_file_from_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    let store = flock_dsn(tmp.path());
    let count = "ls -l /proc/$$/fd | grep -c 'xtr\\.o\\.' || true";
    xtr()
        .args(["run", "--store", &store, "o", "-c", count])
        .assert()
        .success()
        .stdout("1\n");
    xtr()
        .args(["run", "-o", "--store", &store, "o", "-c", count])
        .assert()
        .success()
        .stdout("0\n");
    // Without the descriptor the lock is still held while the command runs.
    let run = spawn(&["run", "-o", "--store", &store, "o", "sleep", "30"]);
    wait_held(&store, "o");
    xtr()
        .args(["run", "-n", "--store", &store, "o", "true"])
        .assert()
        .code(1);
    stop(run);
}

// ---- JSON events -----------------------------------------------------------------------------

fn events(stderr: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stderr)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// The `xtr_lock` field of each event.
fn names(ev: &[serde_json::Value]) -> Vec<&str> {
    ev.iter().map(|e| e["xtr_lock"].as_str().unwrap()).collect()
}

/// A run that waits for a holder, then runs its command (which exits 4).
fn json_events_of_a_wait(store: &str) {
    let holder = spawn(&["run", "--store", store, "ev", "--", "sleep", "30"]);
    wait_held(store, "ev");
    let mut waiter = spawn(&[
        "run", "--json", "--store", store, "ev", "--", "sh", "-c", "exit 4",
    ]);
    let (_, reader) = stderr_after_first_line(&mut waiter);
    stop(holder);
    assert_eq!(waiter.wait().unwrap().code(), Some(4));
    let ev = events(reader.join().unwrap().as_bytes());
    assert_eq!(
        names(&ev),
        ["waiting", "acquired", "released", "exit"],
        "{ev:?}"
    );
    assert!(ev[0]["held_by"].as_str().unwrap().starts_with("holder "));
    assert!(ev[1]["fencing_token"].as_u64().unwrap() > 0);
    assert_eq!(ev[1]["mode"], "write");
    assert_eq!(ev[3]["code"], 4);
}

/// A loss: the key deleted under the command.
fn json_events_of_a_loss(server: &RedisServer, store: &str) {
    let run = spawn(&[
        "run",
        "--json",
        "--ttl",
        "1s",
        "--kill-after",
        "1s",
        "--store",
        store,
        "ev",
        "sleep",
        "30",
    ]);
    wait_held(store, "ev");
    server.cli(&["DEL", "ev"]);
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let ev = events(&out.stderr);
    assert_eq!(names(&ev), ["acquired", "lost", "exit"], "{ev:?}");
    assert!(
        ev[1]["reason"].as_str().unwrap().contains("was lost"),
        "{ev:?}"
    );
    assert_eq!(ev[2]["code"], 3);
}

/// Conflicts and errors are events too, the supervisor's own messages (it heads the command's
/// group on Redis) included.
fn json_events_of_conflicts_and_errors(store: &str) {
    let held = spawn(&["run", "--store", store, "ev", "--", "sleep", "30"]);
    wait_held(store, "ev");
    let out = xtr()
        .args(["run", "--json", "-n", "--store", store, "ev", "true"])
        .output()
        .unwrap();
    let ev = events(&out.stderr);
    assert_eq!(ev[0]["xtr_lock"], "conflict");
    assert_eq!(ev[1]["code"], 1);
    stop(held);
    let out = xtr()
        .args(["run", "--json", "--store", "redis://h?x=1", "ev", "true"])
        .output()
        .unwrap();
    let ev = events(&out.stderr);
    assert_eq!(ev[0]["xtr_lock"], "error");
    assert!(
        ev[0]["message"]
            .as_str()
            .unwrap()
            .contains("unknown option \"x\"")
    );
    assert_eq!(ev[1]["code"], 2);
    let out = xtr()
        .args([
            "run",
            "--json",
            "--store",
            store,
            "ev",
            "no-such-command-here",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    let ev = events(&out.stderr);
    assert_eq!(
        names(&ev),
        ["acquired", "error", "released", "exit"],
        "{ev:?}"
    );
    assert_eq!(ev[1]["message"], "command not found: no-such-command-here");
}

#[test]
fn run_json_reports_each_event_as_a_line() {
    let server = RedisServer::start();
    let store = server.url(0);
    json_events_of_a_wait(&store);
    json_events_of_a_loss(&server, &store);
    json_events_of_conflicts_and_errors(&store);
    let out = xtr()
        .args(["run", "--json", "--store", "in-memory", "ev", "true"])
        .output()
        .unwrap();
    assert_eq!(events(&out.stderr)[0]["xtr_lock"], "warning");
}

// ---- stores from the environment, checked DSNs -----------------------------------------------

#[test]
fn a_quorum_comes_from_a_comma_separated_environment() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let list: Vec<String> = servers.iter().map(|s| s.url(0)).collect();
    xtr()
        .args(["run", "q", "-c", "echo $XTR_LOCK_SCHEME"])
        .env("XTR_LOCK_STORE", list.join(","))
        .assert()
        .success()
        .stdout("combined(redis,redis,redis)\n");
    // Also in one --store.
    xtr()
        .args([
            "run",
            "--store",
            &list.join(", "),
            "q",
            "-c",
            "echo $XTR_LOCK_SCHEME",
        ])
        .assert()
        .success()
        .stdout("combined(redis,redis,redis)\n");
}

#[test]
fn dsns_are_checked_with_hints() {
    let cases: &[(&str, &str)] = &[
        (
            "redis://u:hunter2@127.0.0.1:1/0?sockettimeout=3",
            "xtr-lock: error: --store names no usable store: invalid Redis connection string \
             \"redis:\": unknown option \"sockettimeout\"; did you mean \"socket_timeout\"?\n",
        ),
        (
            "/var/lock",
            "xtr-lock: error: --store names no usable store: unsupported connection \
             \"/var/lock\": a path is not a store; flock:///var/lock was probably meant\n",
        ),
        (
            "flock:///var/lock?name=long",
            "xtr-lock: error: --store names no usable store: invalid flock connection string \
             \"flock:\": unknown option \"name=long\"; the one option is names=long (or names=short, the \
             default)\n",
        ),
    ];
    for (dsn, message) in cases {
        xtr()
            .args(["run", "--store", dsn, "r", "true"])
            .assert()
            .code(2)
            .stderr(*message);
    }
    for (dsn, warning) in [
        ("in-memory", "in-memory locks live in this process only"),
        ("null", "the null store locks nothing"),
    ] {
        xtr()
            .args(["run", "--store", dsn, "r", "true"])
            .assert()
            .success()
            .stderr(predicate::str::starts_with(format!(
                "xtr-lock: warning: {warning}"
            )));
        xtr()
            .args(["run", "-q", "--store", dsn, "r", "true"])
            .assert()
            .success()
            .stderr("");
    }
}

#[test]
fn run_help_lists_the_environment_exit_codes_and_ttl() {
    let out = xtr().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "XTR_LOCK_RESOURCE",
        "XTR_LOCK_MODE",
        "XTR_LOCK_FENCING_TOKEN",
        "XTR_LOCK_SCHEME",
        "XTR_LOCK_LOCATION",
        "the caller's own, plus what names the store run used",
        "The ttl (5m unless --ttl",
        "Stores that give fencing tokens: redis,",
        "Exit codes:",
        "status:  0 held, 1 free",
        "xtr-lock run -n backup ./job",
        "--timeout",
    ] {
        assert!(
            help.contains(needle),
            "run --help lacks {needle:?}:\n{help}"
        );
    }
}
