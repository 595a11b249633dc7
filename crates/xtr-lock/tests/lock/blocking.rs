//! The blocking API from plain threads, on flock and on a Redis server the testkit starts:
//! contention, a timeout that leaves nothing held, guards released by drop, renewal and the
//! loss signal, the registry, and refusals inside a tokio runtime.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use xtr_lock::blocking::{LockFactory, Locks};
use xtr_lock::config::LocksConfig;
use xtr_lock::{ErrorKind, Mode, Release};
use xtr_lock_testkit::redis::RedisServer;

fn contend(factory: &LockFactory) {
    let holder = factory.create_lock("job");
    let guard = holder.lock().unwrap();
    assert!(guard.took());
    let (tx, rx) = mpsc::channel();
    let other = factory.clone();
    let waiter = thread::spawn(move || {
        let lock = other.create_lock("job");
        // Held: the timeout runs out and leaves nothing held.
        assert!(!lock.acquire_timeout(Duration::from_millis(100)).unwrap());
        assert_eq!(lock.held_mode(), None);
        tx.send(()).unwrap();
        // Then waits until the guard below is dropped.
        lock.acquire().unwrap();
        assert_eq!(lock.release().unwrap(), Release::Released);
    });
    rx.recv().unwrap();
    drop(guard); // released before drop returns
    waiter.join().unwrap();
    let third = factory.create_lock("job");
    assert!(third.try_acquire().unwrap(), "nothing left held");
    assert_eq!(third.release().unwrap(), Release::Released);
}

#[test]
fn threads_contend_on_flock() {
    let dir = tempfile::tempdir().unwrap();
    let factory = LockFactory::from_dsn(&format!("flock://{}", dir.path().display())).unwrap();
    contend(&factory);
    // Readers share.
    let (a, b) = (factory.create_lock("r"), factory.create_lock("r"));
    let ga = a.lock_read().unwrap();
    assert!(b.try_acquire_read().unwrap());
    assert!(!factory.create_lock("r").try_acquire().unwrap());
    assert_eq!(b.release().unwrap(), Release::Released);
    assert_eq!(ga.unlock().unwrap(), Release::Released);
}

#[test]
fn threads_contend_on_redis_and_a_timed_out_wait_stores_nothing() {
    let server = RedisServer::start();
    let factory = LockFactory::from_dsn(&server.url(0)).unwrap();
    contend(&factory);
    // A wait that times out many times over leaves no key of its own behind.
    let holder = factory.create_lock("busy");
    assert!(holder.try_acquire().unwrap());
    for _ in 0..20 {
        assert!(
            !factory
                .create_lock("busy")
                .acquire_timeout(Duration::from_millis(5))
                .unwrap()
        );
    }
    assert_eq!(holder.release().unwrap(), Release::Released);
    assert_eq!(server.cli(&["EXISTS", "busy"]).trim(), "0");
    factory.close().unwrap();
}

#[test]
fn a_guard_keeps_its_lock_alive_and_tells_when_it_is_lost() {
    let server = RedisServer::start();
    let factory = LockFactory::from_dsn(&server.url(0))
        .unwrap()
        .with_ttl(Some(Duration::from_millis(600)));
    let lock = factory.create_lock("kept");
    let guard = lock.lock().unwrap();
    // Renewed in the background past several ttls while this thread only waits.
    assert!(
        guard
            .wait_lost(Duration::from_millis(1500))
            .unwrap()
            .is_none()
    );
    assert!(!guard.is_lost());
    assert!(lock.is_acquired().unwrap());
    // Someone deletes the key: the guard is told.
    server.cli(&["DEL", "kept"]);
    let lost = guard
        .wait_lost(Duration::from_secs(10))
        .unwrap()
        .expect("the loss is reported");
    assert_eq!(lost.resource, "kept");
    assert!(guard.is_lost());
    assert_eq!(guard.unlock().unwrap(), Release::Lost);

    // A scope whose lock is lost while its body runs does not return Ok.
    let out = lock.scoped(|| {
        server.cli(&["DEL", "kept"]);
        Ok::<_, xtr_lock::Error>(1)
    });
    assert_eq!(out.unwrap_err().kind(), ErrorKind::Lost);
    // A KeepAlive of a plain acquire reports the same way.
    lock.acquire().unwrap();
    let keep = lock.keep_alive().unwrap();
    server.cli(&["DEL", "kept"]);
    assert!(keep.wait_lost(Duration::from_secs(10)).unwrap().is_some());
    keep.stop();
}

#[test]
fn the_registry_runs_bodies_with_the_entrys_prefix_and_wait() {
    let server = RedisServer::start();
    let config = LocksConfig::from_toml_str(&format!(
        "prefix = \"app:\"\nwait = \"0\"\n[stores]\ndefault = \"{}\"\n",
        server.url(0)
    ))
    .unwrap();
    let locks = Locks::new(&config).unwrap();
    let seen = locks
        .run("job", || {
            Ok::<_, xtr_lock::Error>(server.cli(&["EXISTS", "app:job"]).trim().to_owned())
        })
        .unwrap();
    assert_eq!(seen, "1", "held under its prefixed name while the body ran");
    assert_eq!(server.cli(&["EXISTS", "app:job"]).trim(), "0");
    let held = locks.lock("job").unwrap();
    assert!(held.try_acquire().unwrap());
    let busy = locks
        .run("job", || Ok::<_, xtr_lock::Error>(()))
        .unwrap_err();
    assert_eq!(
        busy.kind(),
        ErrorKind::Conflict,
        "the entry's wait: try once"
    );
    assert_eq!(held.release().unwrap(), Release::Released);
    let mode = locks
        .run_read("job", || Ok::<_, xtr_lock::Error>(Mode::Read))
        .unwrap();
    assert_eq!(mode, Mode::Read);
    let report = locks.ping(Duration::from_secs(2)).unwrap();
    assert!(report.iter().all(|(_, r)| r.is_ok()), "{report:?}");
    locks.close().unwrap();
}

#[tokio::test]
async fn inside_a_runtime_it_refuses_instead_of_blocking() {
    let err = LockFactory::from_dsn("in-memory").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("inside a tokio runtime"), "{err}");

    // Made on a plain thread, then used here: each call refuses; a guard dropped here still
    // releases (scheduled on the factory's own runtime).
    let dir = tempfile::tempdir().unwrap();
    let dsn = format!("flock://{}", dir.path().display());
    let (factory, guard) = thread::spawn(move || {
        let factory = LockFactory::from_dsn(&dsn).unwrap();
        let guard = factory.create_lock("x").lock().unwrap();
        (factory, guard)
    })
    .join()
    .unwrap();
    let lock = factory.create_lock("x");
    assert_eq!(
        lock.try_acquire().unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    drop(guard);
    let free = thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if lock.try_acquire().unwrap() {
                return lock.release().unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "the dropped guard's lock stayed held"
            );
            thread::sleep(Duration::from_millis(5));
        }
    });
    assert_eq!(
        tokio::task::spawn_blocking(move || free.join().unwrap())
            .await
            .unwrap(),
        Release::Released
    );
    drop(factory);
}
