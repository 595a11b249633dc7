//! The registry of a configuration's entries (`Locks`) over memory, flock and Redis: prefixes,
//! ttls and waits per entry, keys handed out and back, stores built on first use, close.

use std::time::Duration;

use xtr_lock::config::{Locks, LocksConfig};
use xtr_lock::{ErrorKind, Key, Lockable as _, Wait};
use xtr_lock_testkit::redis::RedisServer;

fn locks(toml: &str) -> Locks {
    Locks::new(&LocksConfig::from_toml_str(toml).unwrap()).unwrap()
}

#[tokio::test]
async fn entries_give_their_prefix_ttl_and_wait() {
    let locks = locks(
        r#"
prefix = "app:"
ttl = "1 minute"
wait = "0"
default = "mem"
[stores]
mem = "in-memory"
other = { dsn = "in-memory", prefix = "", ttl = "none", wait = "forever" }
"#,
    );
    assert_eq!(locks.default_entry(), "mem");
    assert_eq!(locks.entries().collect::<Vec<_>>(), ["mem", "other"]);
    let a = locks.lock("job").unwrap();
    assert_eq!(a.resource(), "app:job");
    assert_eq!(a.ttl(), Some(Duration::from_secs(60)));
    assert_eq!(locks.entry("mem").unwrap().wait, Wait::Never);
    let b = locks.lock_on("other", "job").unwrap();
    assert_eq!((b.resource(), b.ttl()), ("job", None));

    // One store per entry, shared by its locks and by clones of the registry.
    let clone = locks.clone();
    assert!(a.try_acquire().await.unwrap());
    assert!(!clone.lock("job").unwrap().try_acquire().await.unwrap());
    // The entry's wait (try once) makes run give up at once while the lock is held.
    let busy = locks
        .run("job", || async { Ok::<_, xtr_lock::Error>(()) })
        .await
        .unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Conflict);
    assert_eq!(busy.resource(), Some("app:job"));
    let _ = a.release().await.unwrap();
    let ran = locks
        .run("job", || async { Ok::<_, xtr_lock::Error>(7) })
        .await
        .unwrap();
    assert_eq!(ran, 7);

    let unknown = locks.lock_on("nope", "job").unwrap_err().to_string();
    assert!(
        unknown.contains("no lock configuration entry named \"nope\" (the entries: mem, other)"),
        "{unknown}"
    );
    locks.close().await.unwrap();
}

#[tokio::test]
async fn keys_go_out_and_come_back_with_their_prefix() {
    let locks = locks("prefix = \"app:\"\n[stores]\ndefault = \"in-memory\"\n");
    let key = locks.key("report").unwrap();
    assert_eq!(key.resource(), "app:report");
    let lock = locks.from_key(key.clone()).unwrap();
    assert!(lock.try_acquire().await.unwrap());
    // The same holder, taken back through its serialized form.
    let back = locks
        .from_key(Key::from_json(&key.to_json().unwrap()).unwrap())
        .unwrap();
    assert!(back.is_acquired().await.unwrap());
    let _ = back.release().await.unwrap();
    let foreign = locks.from_key(Key::new("other:report")).unwrap_err();
    assert_eq!(foreign.kind(), ErrorKind::InvalidArgument);
    assert!(
        foreign
            .to_string()
            .contains("made by another configuration"),
        "{foreign}"
    );
}

#[tokio::test]
async fn nothing_is_built_before_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let locks_dir = dir.path().join("locks");
    let config = format!(
        "[stores]\ndefault = \"flock://{}\"\nunused = \"redis://127.0.0.1:1/0\"\n",
        locks_dir.display()
    );
    let locks = locks(&config);
    assert!(
        !locks_dir.exists(),
        "the flock directory is made on first use"
    );
    let lock = locks.lock("job").unwrap();
    assert!(locks_dir.is_dir());
    assert!(lock.try_acquire().await.unwrap());
    assert!(!locks.lock("job").unwrap().try_acquire().await.unwrap());
    let _ = lock.release().await.unwrap();
    // The unreachable Redis entry was never used: closing does not touch it.
    locks.close().await.unwrap();
}

#[tokio::test]
async fn redis_entries_and_quorums_lock_and_close() {
    let (a, b, c) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    let config = format!(
        "ttl = \"10s\"\nwait = \"2s\"\ndefault = \"redis\"\n[stores]\nredis = \"{}\"\nquorum = [\"{}\", \"{}\", \"{}\"]\n",
        a.url(0),
        a.url(1),
        b.url(0),
        c.url(0)
    );
    let locks = locks(&config);
    let held = locks.lock("job").unwrap();
    assert!(held.try_acquire().await.unwrap());
    let started = std::time::Instant::now();
    let busy = locks
        .run("job", || async { Ok::<_, xtr_lock::Error>(()) })
        .await
        .unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::Conflict, "{busy}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the entry's wait was used"
    );
    let _ = held.release().await.unwrap();
    let on_quorum = locks.lock_on("quorum", "job").unwrap();
    assert!(on_quorum.try_acquire().await.unwrap());
    assert!(
        !locks
            .lock_on("quorum", "job")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
    );
    let _ = on_quorum.release().await.unwrap();
    locks.close().await.unwrap();
    // Used again after close: it reconnects.
    assert!(locks.lock("job").unwrap().try_acquire().await.unwrap());
}

#[test]
fn a_bad_configuration_is_refused_with_every_problem() {
    let config = LocksConfig::from_toml_str(
        "[stores]\na = \"redis://:${XTR_LOCK_TEST_SURELY_UNSET}@h\"\nb = \"nosuch://x\"\n",
    )
    .unwrap();
    let err = Locks::new(&config).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let text = err.to_string();
    assert!(text.contains("3 problems"), "{text}");
    assert!(
        text.contains("stores.a: ${XTR_LOCK_TEST_SURELY_UNSET} is not set"),
        "{text}"
    );
    assert!(text.contains("stores.b: unsupported connection"), "{text}");
    assert!(
        text.contains("default: no entry named \"default\""),
        "{text}"
    );
}

#[tokio::test]
async fn ping_reaches_every_entry_and_names_the_ones_that_fail() {
    let up = RedisServer::start();
    let paused = RedisServer::start();
    let mut down = RedisServer::start();
    down.kill();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "prefix = \"app:\"\n[stores]\ndefault = \"in-memory\"\nfiles = \"flock://{}\"\n\
         redis = \"{}\"\npaused = \"{}\"\ndown = \"{}\"\n",
        dir.path().display(),
        up.url(0),
        paused.url(0),
        down.url(0),
    );
    let locks = locks(&config);
    // Someone else holds the ping lock on one entry: reached all the same.
    let other = locks
        .lock_on("redis", xtr_lock::config::PING_RESOURCE)
        .unwrap();
    assert!(other.try_acquire().await.unwrap());
    paused.pause();
    let report = locks.ping(Duration::from_secs(1)).await;
    paused.resume();
    let names: Vec<&str> = report.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["default", "down", "files", "paused", "redis"]);
    for (entry, answer) in &report {
        match entry.as_str() {
            "down" | "paused" => {
                let err = answer.as_ref().unwrap_err().to_string();
                assert!(err.contains("app:xtr-lock-ping"), "{entry}: {err}");
            }
            _ => assert!(answer.is_ok(), "{entry}: {answer:?}"),
        }
    }
    let _ = other.release().await.unwrap();
    // A ping holds nothing afterwards: the ping lock is free on every reachable entry.
    for entry in ["default", "files", "redis"] {
        let lock = locks
            .lock_on(entry, xtr_lock::config::PING_RESOURCE)
            .unwrap();
        assert_eq!(lock.resource(), "app:xtr-lock-ping");
        assert!(lock.try_acquire().await.unwrap(), "{entry}");
        let _ = lock.release().await.unwrap();
    }
    locks.close().await.unwrap();
}

#[tokio::test]
async fn a_dropped_ping_leaves_nothing_held() {
    let server = RedisServer::start();
    let locks = locks(&format!("[stores]\ndefault = \"{}\"\n", server.url(0)));
    let probe = locks.lock(xtr_lock::config::PING_RESOURCE).unwrap();
    for step in 0..40u64 {
        // From before the first command to after the release, in 25 µs steps.
        let budget = Duration::from_micros(step * 25);
        let _ = tokio::time::timeout(budget, locks.ping(Duration::from_secs(5))).await;
        // A dropped ping's lock is released in the background: free again soon after.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !probe.try_acquire().await.unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "step {step}: still held"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = probe.release().await.unwrap();
    }
    locks.close().await.unwrap();
}
