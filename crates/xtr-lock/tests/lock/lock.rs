//! Lock-level behaviour after the acquire: refresh, release, per-holder turns, runtimes, the
//! factory, logging. Acquiring is in `acquire.rs`, scoped use in `scope.rs`.
//! Stores are real (in-memory, null), wrapped by `support::Scripted` where a test needs to see
//! or perturb the calls.

use std::sync::Arc;
use std::time::Duration;

use xtr_lock::{
    Error, ErrorKind, InMemoryStore, Key, Lock, LockFactory, Lockable as _, LostReason,
    ManualClock, Release, Store,
};

use crate::support::{Capture, Scripted, When, expiring_memory, manual, secs};

// ---- refresh ------------------------------------------------------------------------------

#[tokio::test]
async fn refresh_needs_a_positive_duration_and_checks_before_any_store_call() {
    let store = Scripted::new(InMemoryStore::new());
    let factory = LockFactory::from_arc(store.clone());
    for (lock_ttl, arg) in [
        (None, None),
        (Some(secs(10.0)), Some(Duration::ZERO)),
        (None, Some(Duration::ZERO)),
        (Some(Duration::ZERO), None),
    ] {
        let lock = factory.create_lock("r").with_ttl(lock_ttl);
        let err = lock.refresh(arg).await.unwrap_err();
        assert!(
            err.is_invalid_argument(),
            "({lock_ttl:?}, {arg:?}): {err:?}"
        );
        assert_eq!(err.resource(), Some("r"));
    }
    assert_eq!(
        factory
            .create_lock("r")
            .refresh(Some(Duration::ZERO))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidTtl
    );
    assert!(store.ops().is_empty(), "no store call: {:?}", store.ops());
}

#[tokio::test]
async fn refresh_uses_the_lock_ttl_or_the_argument() {
    let store = Scripted::new(InMemoryStore::new());
    let factory = LockFactory::from_arc(store.clone());
    let lock = factory.create_lock("r").with_ttl(Some(secs(10.0)));
    lock.try_acquire().await.unwrap();
    lock.refresh(None).await.unwrap();
    lock.refresh(Some(secs(3.0))).await.unwrap();
    assert_eq!(
        store.ops()[1..],
        ["put_off(ttl=10s)".to_owned(), "put_off(ttl=3s)".to_owned()]
    );
}

#[tokio::test]
async fn a_refresh_that_finds_the_lock_gone_reports_it_lost_and_the_guard_says_so() {
    let capture = Capture::default();
    let _log = capture.install();
    let store = Scripted::new(InMemoryStore::new());
    let (factory, _) = manual(store.clone());
    let lock = factory.create_lock("r").with_ttl(Some(secs(10.0)));
    let guard = lock.lock().await.unwrap();
    store.refuse_next("put_off", LostReason::TakenOver);
    let err = lock.refresh(None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err:?}");
    assert_eq!(err.lost_reason(), Some(LostReason::TakenOver));
    assert_eq!(
        err.to_string(),
        "lock 'r' was lost: someone else holds it now"
    );
    assert_eq!(lock.held_mode(), None);
    assert_eq!(lock.lost_reason(), Some(LostReason::TakenOver));
    assert!(
        capture
            .records()
            .iter()
            .any(|r| r.level == tracing::Level::WARN
                && r.message == "failed to define an expiration for the lock: it was lost"
                && r.fields["resource"] == "r")
    );
    assert!(guard.is_lost());
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);
    // Never acquired, or released: a conflict, not a loss.
    let err = lock.refresh(None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err:?}");
}

#[tokio::test]
async fn other_refresh_failures_are_wrapped_and_expiry_passes_through() {
    let store = Scripted::new(InMemoryStore::new());
    let (factory, _) = manual(store.clone());
    let lock = factory.create_lock("r").with_ttl(Some(secs(10.0)));
    lock.acquire().await.unwrap();
    store.fail_next("put_off", When::Before, Error::storage("boom"));
    let err = lock.refresh(None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Acquiring);
    assert_eq!(err.to_string(), "lock 'r': failed to define an expiration");
    assert_eq!(std::error::Error::source(&err).unwrap().to_string(), "boom");

    let clock = ManualClock::new();
    let store = Scripted::new(expiring_memory(&clock));
    let factory = LockFactory::from_arc(store.clone()).with_clock(Arc::new(clock.clone()));
    let lock = factory.create_lock("r").with_ttl(Some(secs(10.0)));
    lock.acquire().await.unwrap();
    store.advance_after("put_off", clock.clone(), secs(2.0));
    let err = lock.refresh(Some(secs(1.0))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Expired);
    assert!(
        !store.inner().exists(lock.key()).await.unwrap().is_held(),
        "taken back"
    );
}

// ---- release ------------------------------------------------------------------------------

#[tokio::test]
async fn release_failures_are_releasing_errors() {
    let capture = Capture::default();
    let _log = capture.install();
    let store = Scripted::new(InMemoryStore::new());
    let (factory, _) = manual(store.clone());
    let lock = factory.create_lock("r");
    lock.acquire().await.unwrap();
    store.fail_next("delete", When::Before, Error::storage("boom"));
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Releasing);
    assert_eq!(err.to_string(), "lock 'r': failed to release the lock");
    assert_eq!(std::error::Error::source(&err).unwrap().to_string(), "boom");
    let warn = capture
        .records()
        .into_iter()
        .find(|r| r.level == tracing::Level::WARN)
        .unwrap();
    assert_eq!(warn.message, "failed to release the lock");
    assert!(!warn.fields.contains_key("error"), "resource only");

    let releasing = Error::new(ErrorKind::Releasing)
        .with_resource("r")
        .with_reason("still locked");
    store.fail_next("delete", When::Before, releasing);
    let err = lock.release().await.unwrap_err();
    assert_eq!(
        err.reason(),
        Some("still locked"),
        "passed through unchanged"
    );
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert!(
        capture
            .records()
            .iter()
            .any(|r| r.level == tracing::Level::DEBUG && r.message == "released the lock")
    );
}

// ---- holders and turns --------------------------------------------------------------------

#[tokio::test]
async fn operations_of_one_holder_take_turns_but_a_wait_never_blocks_them() {
    let store = Scripted::new(InMemoryStore::new());
    let factory = LockFactory::from_arc(store.clone()).with_ttl(None);
    let lock = factory.create_lock("r");
    store.hold_replies("save");
    let saving = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let releasing = tokio::spawn({
        let lock = lock.clone();
        async move { lock.release().await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let asking = tokio::spawn({
        let lock = lock.clone();
        async move { lock.is_acquired().await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store.op_names(),
        ["save"],
        "delete and exists wait their turn"
    );
    store.release_replies();
    assert!(saving.await.unwrap().unwrap());
    assert_eq!(releasing.await.unwrap().unwrap(), Release::Released);
    assert!(!asking.await.unwrap().unwrap());
    assert_eq!(store.op_names(), ["save", "delete", "exists"]);

    // A blocking wait of the holder does not hold its turn: a release still gets through.
    let (factory, _) = (LockFactory::from_arc(Arc::new(InMemoryStore::new())), ());
    let other = factory.create_lock("w");
    other.acquire().await.unwrap();
    let me = factory.create_lock("w");
    let wait = tokio::spawn({
        let me = me.clone();
        async move { me.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), me.release())
        .await
        .expect("a release is not blocked by the holder's own wait")
        .unwrap();
    wait.abort();
}

#[test]
fn a_key_keeps_working_on_a_second_runtime() {
    let store = Arc::new(InMemoryStore::new());
    let factory = LockFactory::from_arc(store);
    let lock = factory.create_lock("r");
    let rt1 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert!(rt1.block_on(lock.try_acquire()).unwrap());
    drop(rt1);
    let rt2 = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let other = factory.create_lock("r");
    rt2.block_on(async {
        assert!(lock.is_acquired().await.unwrap());
        assert!(!other.try_acquire().await.unwrap());
        let _ = lock.release().await.unwrap();
        assert!(other.try_acquire().await.unwrap());
    });
}

#[tokio::test]
async fn factory_locks_are_new_holders_and_from_key_is_the_same_holder() {
    let factory = LockFactory::new(InMemoryStore::new());
    let a = factory.create_lock("r");
    let b = factory.create_lock("r");
    assert!(!Key::same_holder(a.key(), b.key()));
    let a2 = factory.create_lock_from_key(a.key().clone());
    assert!(Key::same_holder(a.key(), a2.key()));
    assert!(a.try_acquire().await.unwrap());
    assert!(a2.is_acquired().await.unwrap());
    assert!(!b.try_acquire().await.unwrap());
}

#[tokio::test]
async fn a_lock_displays_resource_and_store_and_cannot_be_serialized() {
    let factory = LockFactory::new(InMemoryStore::new());
    let lock = factory.create_lock("r");
    assert_eq!(lock.to_string(), "Lock('r', in-memory)");
    // `Lock` does not implement `Serialize`; its key does, the lock is a process-local handle.
    fn not_serialize<T>(_: &T) {}
    not_serialize(&lock);
}

// ---- logging ------------------------------------------------------------------------------

#[tokio::test]
async fn successes_log_at_debug_contention_at_info_with_the_resource() {
    let capture = Capture::default();
    let _log = capture.install();
    let (factory, _) = manual(Arc::new(InMemoryStore::new()));
    let a = factory.create_lock("reports");
    a.try_acquire().await.unwrap();
    factory.create_lock("reports").try_acquire().await.unwrap();
    let _ = a.release().await.unwrap();
    let records = capture.records();
    let find = |level, message: &str| {
        records
            .iter()
            .find(|r| r.level == level && r.message == message)
            .unwrap_or_else(|| panic!("no {level} record {message:?} in {records:#?}"))
    };
    let acquired = find(tracing::Level::DEBUG, "acquired the lock");
    assert_eq!(acquired.fields["resource"], "reports");
    assert!(acquired.fields.contains_key("fencing_token"));
    find(
        tracing::Level::INFO,
        "failed to acquire the lock, someone else holds it",
    );
    find(tracing::Level::DEBUG, "released the lock");
    assert!(records.iter().all(|r| r.target == "xtr_lock"));
    assert!(records.iter().all(|r| r.fields.contains_key("resource")));
}

#[tokio::test]
async fn refresh_logs_the_ttl_at_debug() {
    let capture = Capture::default();
    let _log = capture.install();
    let (factory, _) = manual(Arc::new(InMemoryStore::new()));
    let lock = factory.create_lock("r").with_ttl(Some(secs(10.0)));
    lock.try_acquire().await.unwrap();
    lock.refresh(None).await.unwrap();
    let rec = capture
        .records()
        .into_iter()
        .find(|r| r.message == "expiration defined for the lock")
        .unwrap();
    assert_eq!(rec.level, tracing::Level::DEBUG);
    assert_eq!(rec.fields["ttl"], "10s");
}

#[allow(dead_code)]
fn lock_is_send_sync_clone(l: Lock) -> impl Send + Sync + Clone {
    l
}
