//! Scoped use: guards, `scoped`, `LockFactory::run`, `NoLock` and the null store, on real
//! stores (in-memory, null), wrapped by `support::Scripted` where a test needs to see or perturb
//! the calls.

use std::sync::Arc;
use std::time::Duration;

use xtr_lock::{
    Error, ErrorKind, InMemoryStore, Key, LockFactory, Lockable, LostReason, ManualClock, NoLock,
    NullStore, Release, RunOptions, Store, Wait,
};

use crate::support::{Capture, Scripted, When, expiring_memory, manual, secs};

// ---- scoped use, guards, run ----------------------------------------------------------------

#[tokio::test]
async fn the_body_error_wins_over_a_release_error_which_is_returned_after_success() {
    let capture = Capture::default();
    let _log = capture.install();
    let store = Scripted::new(InMemoryStore::new());
    let (factory, _) = manual(store.clone());
    let lock = factory.create_lock("r");

    store.fail_next("delete", When::Before, Error::storage("boom"));
    let err = lock
        .scoped(async { Err::<(), _>(Error::invalid_argument("body")) })
        .await
        .unwrap_err();
    assert_eq!(err.reason(), Some("body"));
    assert!(
        capture
            .records()
            .iter()
            .any(|r| r.level == tracing::Level::WARN
                && r.message == "failed to release the lock after the scope failed")
    );
    let _ = lock.release().await.unwrap();

    store.fail_next("delete", When::Before, Error::storage("boom"));
    let err = lock.scoped(async { Ok::<_, Error>(1) }).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Releasing);
}

#[tokio::test]
async fn a_scope_whose_lock_was_lost_says_so() {
    let store = Scripted::new(InMemoryStore::new());
    let (factory, _) = manual(store.clone());
    let lock = factory.create_lock("r");
    let out = lock
        .scoped(async {
            // Lost behind the scope's back: a copy of the holder released it.
            let copy = Key::from_json(&lock.key().to_json().unwrap()).unwrap();
            store.inner().delete(&copy).await.unwrap();
            Ok::<_, Error>("body done")
        })
        .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err:?}");
    assert_eq!(err.lost_reason(), Some(LostReason::Removed));
    let other = factory.create_lock("r");
    assert!(other.try_acquire().await.unwrap(), "nothing was left held");
}

#[tokio::test]
async fn a_dropped_guard_schedules_the_release() {
    let (factory, _) = manual(Arc::new(InMemoryStore::new()));
    let lock = factory.create_lock("r");
    let guard = lock.lock().await.unwrap();
    assert!(guard.took());
    let nested = lock.lock().await.unwrap();
    assert!(!nested.took());
    drop(nested);
    assert!(
        lock.is_acquired().await.unwrap(),
        "a nested guard leaves the lock held"
    );
    drop(guard);
    assert!(
        !lock.is_acquired().await.unwrap(),
        "released before the next operation"
    );
    assert!(factory.create_lock("r").try_acquire().await.unwrap());
}

#[test]
fn a_guard_dropped_outside_any_runtime_still_releases() {
    let store = Arc::new(InMemoryStore::new());
    let factory = LockFactory::from_arc(store);
    let lock = factory.create_lock("r");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = rt.block_on(lock.lock()).unwrap();
    drop(guard); // no runtime here: a thread runs the release
    let other = factory.create_lock("r");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), other.acquire())
            .await
            .expect("released by the background thread")
            .unwrap();
    });
}

#[tokio::test]
async fn keep_leaves_the_lock_held() {
    let (factory, _) = manual(Arc::new(InMemoryStore::new()));
    let lock = factory.create_lock("r").lock().await.unwrap().keep();
    tokio::task::yield_now().await;
    assert!(lock.is_acquired().await.unwrap());
}

#[tokio::test]
async fn run_waits_then_fails_naming_the_resource() {
    let (factory, _) = manual(Arc::new(InMemoryStore::new()));
    let holder = factory.create_lock("nightly");
    holder.acquire().await.unwrap();
    let err = factory
        .run("nightly", RunOptions::new().wait(Wait::Never), || async {
            Ok::<_, Error>(())
        })
        .await
        .unwrap_err();
    assert!(err.is_conflict());
    assert_eq!(err.resource(), Some("nightly"));
    assert!(err.to_string().contains("'nightly'"));
    let err = factory
        .run(
            "nightly",
            RunOptions::new().wait(Wait::AtMost(secs(1.0))),
            || async { Ok::<_, Error>(()) },
        )
        .await
        .unwrap_err();
    assert!(err.is_conflict());
    let _ = holder.release().await.unwrap();
    let out = factory
        .run(
            "nightly",
            RunOptions::new()
                .ttl(secs(30.0))
                .wait(Wait::AtMost(secs(1.0))),
            || async { Ok::<_, Error>(7) },
        )
        .await
        .unwrap();
    assert_eq!(out, 7);
    assert!(
        factory.create_lock("nightly").try_acquire().await.unwrap(),
        "released"
    );
}

// ---- NoLock and NullStore -------------------------------------------------------------------

#[tokio::test]
async fn nolock_always_succeeds_and_reports_held() {
    let lock = NoLock::new("r");
    assert!(lock.try_acquire().await.unwrap());
    assert!(lock.try_acquire_read().await.unwrap());
    lock.acquire().await.unwrap();
    assert!(lock.is_acquired().await.unwrap());
    lock.refresh(None).await.unwrap();
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert!(!lock.is_expired());
    assert_eq!(lock.remaining_lifetime(), None);
    assert_eq!(lock.scoped(async { Ok::<_, Error>(5) }).await.unwrap(), 5);
}

#[tokio::test]
async fn code_taking_a_lockable_accepts_lock_and_nolock() {
    async fn guarded(lock: &dyn Lockable) -> xtr_lock::Result<u32> {
        lock.scoped(async { Ok(1) }).await
    }
    let factory = LockFactory::new(InMemoryStore::new());
    assert_eq!(guarded(&factory.create_lock("r")).await.unwrap(), 1);
    assert_eq!(guarded(&NoLock::new("r")).await.unwrap(), 1);
}

#[tokio::test]
async fn a_lock_on_the_null_store_acquires_but_is_never_reported_held() {
    let store = Scripted::new(NullStore::new());
    let factory = LockFactory::from_arc(store.clone());
    let (a, b) = (factory.create_lock("r"), factory.create_lock("r"));
    assert!(a.try_acquire().await.unwrap());
    assert!(b.try_acquire().await.unwrap(), "excludes no one");
    a.acquire().await.unwrap();
    a.acquire_read().await.unwrap();
    assert!(!a.is_acquired().await.unwrap());
    assert_eq!(a.release().await.unwrap(), Release::Released);
    a.refresh(Some(secs(1.0))).await.unwrap();
    // Scopes run, and are never stopped: nothing held can be lost.
    a.scoped(async { Ok::<_, Error>(()) }).await.unwrap();
    let fresh = factory.create_lock("r");
    assert_eq!(fresh.scoped(async { Ok::<_, Error>(3) }).await.unwrap(), 3);
    assert_eq!(fresh.lost_reason(), None);
    let caps = NullStore.capabilities();
    assert!(caps.blocking && caps.blocking_shared && !caps.excludes);
}

// ---- guards tell what they found, and their loss futures are cancel-safe ----------------------

#[tokio::test]
async fn unlock_says_what_it_found() {
    let (factory, _) = manual(Arc::new(InMemoryStore::new()));
    let lock = factory.create_lock("r");
    let guard = lock.lock().await.unwrap();
    let nested = lock.lock().await.unwrap();
    assert_eq!(nested.unlock().await.unwrap(), Release::Kept);
    assert!(
        lock.is_acquired().await.unwrap(),
        "a nested guard keeps the lock"
    );
    assert_eq!(guard.unlock().await.unwrap(), Release::Released);
    // Lost behind the guard's back.
    let guard = lock.lock().await.unwrap();
    let nested = lock.lock().await.unwrap();
    let copy = Key::from_json(&lock.key().to_json().unwrap()).unwrap();
    factory.store().delete(&copy).await.unwrap();
    assert!(!lock.is_acquired().await.unwrap());
    assert_eq!(nested.unlock().await.unwrap(), Release::Lost);
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);
}

/// The loss signal borrows nothing: awaited while the guard is read (no `mut` needed), and
/// moved into a task of its own, it reports the loss.
#[tokio::test]
async fn the_loss_future_is_owned_and_the_guard_stays_usable() {
    let factory = LockFactory::new(InMemoryStore::new()).with_ttl(None);
    let lock = factory.create_lock("r");
    let guard = lock.lock().await.unwrap();
    let watched = tokio::spawn(guard.lost());
    let pending = guard.lost();
    assert!(
        !guard.is_lost() && guard.took(),
        "the guard is read meanwhile"
    );
    let copy = Key::from_json(&lock.key().to_json().unwrap()).unwrap();
    factory.store().delete(&copy).await.unwrap();
    let from_task = tokio::time::timeout(Duration::from_secs(5), watched)
        .await
        .expect("reported")
        .unwrap();
    assert_eq!(from_task.reason, LostReason::Removed);
    let here = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("reported");
    assert_eq!(here.reason, LostReason::Removed);
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);
}

#[tokio::test]
async fn a_dropped_loss_future_misses_nothing() {
    let factory = LockFactory::new(InMemoryStore::new()).with_ttl(None);
    let lock = factory.create_lock("r");
    let guard = lock.lock().await.unwrap();
    let alive = lock.keep_alive().unwrap();
    // Dropped while pending: nothing happens, nothing is lost.
    for _ in 0..3 {
        assert!(
            tokio::time::timeout(Duration::from_millis(20), guard.lost())
                .await
                .is_err()
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(20), alive.lost())
                .await
                .is_err()
        );
    }
    assert!(!guard.is_lost() && !alive.is_lost());
    let copy = Key::from_json(&lock.key().to_json().unwrap()).unwrap();
    factory.store().delete(&copy).await.unwrap();
    // A later call reports the loss, and keeps reporting it.
    for _ in 0..2 {
        let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("reported");
        assert_eq!(lost.reason, LostReason::Removed);
        let lost = tokio::time::timeout(Duration::from_secs(5), alive.lost())
            .await
            .expect("reported");
        assert_eq!(lost.reason, LostReason::Removed);
    }
    assert_eq!(
        alive.lost_now().map(|l| l.reason),
        Some(LostReason::Removed)
    );
}

#[tokio::test]
async fn a_keep_alive_ends_quietly_when_the_lock_is_released() {
    let factory = LockFactory::new(InMemoryStore::new()).with_ttl(None);
    let lock = factory.create_lock("r");
    lock.acquire().await.unwrap();
    let alive = lock.keep_alive().unwrap();
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), alive.lost())
            .await
            .is_err(),
        "a release is not a loss"
    );
    assert!(!alive.is_lost());
    // Nor is a new hold of the same holder the old one's loss.
    lock.acquire().await.unwrap();
    assert!(!alive.is_lost());
    let _ = lock.release().await.unwrap();
}

#[tokio::test]
async fn a_scope_on_a_dyn_lockable_is_stopped_when_its_lock_is_lost() {
    let factory = LockFactory::new(InMemoryStore::new()).with_ttl(None);
    let lock = factory.create_lock("r");
    let dynamic: &dyn Lockable = &lock;
    let key = lock.key().clone();
    let store = factory.store().clone();
    let out: Result<(), Error> = tokio::time::timeout(
        Duration::from_secs(5),
        dynamic.scoped(async move {
            let copy = Key::from_json(&key.to_json().unwrap()).unwrap();
            store.delete(&copy).await.unwrap();
            std::future::pending().await
        }),
    )
    .await
    .expect("stopped");
    assert_eq!(out.unwrap_err().kind(), ErrorKind::Lost);
}

#[tokio::test]
async fn run_takes_a_shared_lock_when_asked() {
    let (factory, _) = manual(Arc::new(InMemoryStore::new()));
    let reader = factory.create_lock("r");
    assert!(reader.try_acquire_read().await.unwrap());
    let out = factory
        .run(
            "r",
            RunOptions::new().shared().wait(Wait::Never),
            || async { Ok::<_, Error>("read alongside") },
        )
        .await;
    assert_eq!(out.unwrap(), "read alongside");
    let out = factory
        .run("r", RunOptions::new().wait(Wait::Never), || async {
            Ok::<_, Error>(())
        })
        .await;
    assert!(
        out.unwrap_err().is_conflict(),
        "a writer waits for the reader"
    );
}

/// Polls `fut` to completion on this thread, outside any tokio runtime.
fn block_on_without_runtime<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

#[test]
fn a_guard_that_cannot_start_its_monitor_releases_what_it_took() {
    // Outside a tokio runtime the memory store still locks, but the renewal cannot start: the
    // failure must not leave the lock held.
    let factory = LockFactory::new(InMemoryStore::new()).with_ttl(Some(secs(30.0)));
    let lock = factory.create_lock("r");
    let err = block_on_without_runtime(lock.lock()).expect_err("no runtime to renew on");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(!block_on_without_runtime(lock.is_acquired()).unwrap());
    let other = factory.create_lock("r");
    assert!(block_on_without_runtime(other.try_acquire()).unwrap());

    // The scoped and factory forms share the path.
    let err = block_on_without_runtime(
        factory
            .create_lock("s")
            .scoped(async { Ok::<_, Error>(()) }),
    )
    .expect_err("no runtime");
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    let err = block_on_without_runtime(factory.run(
        "s",
        RunOptions::new().wait(Wait::Never),
        || async { Ok::<_, Error>(()) },
    ))
    .expect_err("no runtime");
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(block_on_without_runtime(factory.create_lock("s").try_acquire()).unwrap());
}

#[tokio::test]
async fn a_lease_that_runs_out_while_refreshes_fail_is_lost_with_the_error_that_showed_it() {
    let clock = ManualClock::new();
    let store = Scripted::new(expiring_memory(&clock));
    let factory = LockFactory::from_arc(store.clone()).with_clock(Arc::new(clock.clone()));
    let lock = factory.create_lock("r").with_ttl(Some(secs(3.0)));
    let guard = lock.lock().await.unwrap();
    // Every refresh fails as against an unreachable server, more times than the lease lasts.
    for _ in 0..100 {
        let refused = Error::storage("connection refused").temporary();
        store.fail_next("put_off", When::Before, refused);
    }
    let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("told once the lease ran out");
    assert_eq!(lost.reason, LostReason::Unreachable);
    let err = lost
        .error
        .as_deref()
        .expect("the refresh error that showed it");
    assert!(err.is_temporary(), "{err}");
    let cause = std::error::Error::source(err).expect("the store's error");
    assert_eq!(cause.to_string(), "connection refused");
    assert!(clock.elapsed() >= secs(3.0), "not before the lease ran out");
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);
}
