//! Acquiring: one attempt or a wait (polled, woken, native), lifetimes measured from the attempt
//! that won, read locks and their fallback, failures wrapped once and taken back.
//! Stores are real (in-memory, null), wrapped by `support::Scripted` where a test needs to see
//! or perturb the calls.

use std::sync::Arc;
use std::time::Duration;

use xtr_lock::{
    Error, ErrorKind, InMemoryStore, LockFactory, Lockable as _, LostReason, ManualClock, Mode,
    Store,
};

use crate::support::{Capture, Scripted, When, expiring_memory, manual, secs};

// ---- acquire ------------------------------------------------------------------------------

#[tokio::test]
async fn a_non_blocking_acquire_calls_save_once_and_never_waits() {
    let store = Scripted::new(InMemoryStore::new());
    let (factory, clock) = manual(store.clone());
    let holder = factory.create_lock("r");
    assert!(holder.try_acquire().await.unwrap());
    store.clear_ops();
    let other = factory.create_lock("r");
    assert!(!other.try_acquire().await.unwrap());
    assert_eq!(store.op_names(), ["save"]);
    assert_eq!(clock.slept(), Duration::ZERO);
    assert_eq!(other.held_mode(), None);
}

#[tokio::test]
async fn a_blocking_acquire_on_a_store_without_notifications_polls_90_to_110_ms() {
    let store = Scripted::with_caps(InMemoryStore::new(), |mut c| {
        c.notifies = false;
        c
    });
    let (factory, clock) = manual(store.clone());
    for _ in 0..2 {
        store.refuse_next("save", LostReason::TakenOver);
    }
    let lock = factory.create_lock("r");
    lock.acquire().await.unwrap();
    assert_eq!(store.op_names(), ["save", "save", "save"]);
    let sleeps = clock.sleeps();
    assert_eq!(sleeps.len(), 2);
    for s in &sleeps {
        assert!(*s >= secs(0.090) && *s <= secs(0.110), "{s:?}");
        assert_eq!(s.subsec_nanos() % 1_000_000, 0, "whole milliseconds");
    }
    let total = clock.slept();
    assert!(total >= secs(0.18) && total <= secs(0.22), "{total:?}");
}

#[tokio::test]
async fn a_blocking_acquire_of_a_free_lock_is_a_try_and_a_waiter_watches_only_after_a_refusal() {
    let store = Scripted::new(InMemoryStore::new());
    let (factory, clock) = manual(store.clone());
    let lock = factory.create_lock("r");
    lock.acquire().await.unwrap();
    assert_eq!(store.op_names(), ["save"], "nothing but the try's save");
    let _ = lock.release().await.unwrap();
    store.clear_ops();
    lock.acquire_read().await.unwrap();
    assert_eq!(store.op_names(), ["save_read"]);
    let _ = lock.release().await.unwrap();

    // Refused once: register, then attempt again at once (no sleep), before any wait.
    store.clear_ops();
    store.refuse_next("save", LostReason::TakenOver);
    lock.acquire().await.unwrap();
    assert_eq!(store.op_names(), ["save", "watch", "save"]);
    assert!(clock.sleeps().is_empty(), "{:?}", clock.sleeps());
}

#[tokio::test]
async fn a_best_effort_watcher_keeps_the_poll_and_a_complete_one_replaces_it() {
    // Refusals injected before the store: nothing changes, so no watcher ever fires.
    let store = Scripted::new(InMemoryStore::new());
    store.best_effort_watch();
    let (factory, clock) = manual(store.clone());
    for _ in 0..3 {
        store.refuse_next("save", LostReason::TakenOver);
    }
    factory.create_lock("r").acquire().await.unwrap();
    // The first refusal is followed at once by a registration and a second attempt.
    assert_eq!(clock.sleeps().len(), 2, "polled past the silent watcher");

    let store = Scripted::new(InMemoryStore::new());
    let (factory, clock) = manual(store.clone());
    for _ in 0..2 {
        store.refuse_next("save", LostReason::TakenOver);
    }
    let waiting = factory.create_lock("r");
    let stuck = tokio::time::timeout(Duration::from_millis(100), waiting.acquire()).await;
    assert!(stuck.is_err(), "a complete watcher is trusted: no poll");
    assert!(clock.sleeps().is_empty());
}

#[tokio::test]
async fn polling_waiters_yield_to_other_tasks() {
    let store = Scripted::with_caps(InMemoryStore::new(), |mut c| {
        c.notifies = false;
        c
    });
    let factory = LockFactory::from_arc(store).with_ttl(None);
    let holder = factory.create_lock("r");
    holder.acquire().await.unwrap();
    let waiter = factory.create_lock("r");
    // On a current-thread runtime, the release below can only run if the wait yields.
    let wait = tokio::spawn(async move { waiter.acquire().await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_blocking_store_gets_its_native_wait_and_a_wait_that_cannot_go_on_is_an_error() {
    // A store whose keys stay in the process (as flock's): the native wait, never a save.
    let store = Scripted::with_caps(InMemoryStore::new(), |mut c| {
        c.blocking = true;
        c.serializable_keys = false;
        c
    });
    let (factory, _) = manual(store.clone());
    let lock = factory.create_lock("r");
    lock.acquire().await.unwrap();
    assert_eq!(store.op_names(), ["wait_and_save"]);
    let _ = lock.release().await.unwrap();

    // A native wait refuses only when it cannot go on: a blocking acquire reports that as a
    // conflict error, never as acquired.
    store.refuse_next("wait_and_save", LostReason::TakenOver);
    let err = lock.acquire().await.unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    assert_eq!(lock.held_mode(), None);

    // Keys that can travel get one plain attempt first (they may hold what this process does
    // not know of): a free lock is taken by it.
    let store = Scripted::with_caps(InMemoryStore::new(), |mut c| {
        c.blocking = true;
        c
    });
    let (factory, _) = manual(store.clone());
    factory.create_lock("r").acquire().await.unwrap();
    assert_eq!(store.op_names(), ["save"]);
}

#[tokio::test]
async fn the_ttl_goes_into_the_save_and_zero_means_none() {
    let store = Scripted::new(InMemoryStore::new());
    let factory = LockFactory::from_arc(store.clone());
    let lock = factory.create_lock("r");
    assert_eq!(
        lock.ttl(),
        Some(Duration::from_secs(300)),
        "the default ttl"
    );
    lock.try_acquire().await.unwrap();
    lock.with_ttl(Some(Duration::from_secs(10)))
        .try_acquire()
        .await
        .unwrap();
    factory
        .create_lock("z")
        .with_ttl(Some(Duration::ZERO))
        .try_acquire()
        .await
        .unwrap();
    assert_eq!(
        store.ops(),
        [
            "save(ttl=Some(300s))",
            "save(ttl=Some(10s))",
            "save(ttl=None)"
        ]
    );
}

#[tokio::test]
async fn acquiring_twice_with_a_ttl_works() {
    let clock = ManualClock::new();
    let (factory, _) = manual(Arc::new(expiring_memory(&clock)));
    let factory = factory.with_clock(Arc::new(clock.clone()));
    let lock = factory.create_lock("r").with_ttl(Some(secs(10.0)));
    assert!(lock.try_acquire().await.unwrap());
    clock.advance(secs(4.0));
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(
        lock.remaining_lifetime(),
        Some(secs(10.0)),
        "one write of now + ttl"
    );
}

#[tokio::test]
async fn an_acquire_that_expires_on_the_way_is_taken_back_and_reported_expired() {
    let clock = ManualClock::new();
    let store = Scripted::new(expiring_memory(&clock));
    let factory = LockFactory::from_arc(store.clone()).with_clock(Arc::new(clock.clone()));
    // The store is slower than the lifetime: 2 s pass while a 1 s lock is saved.
    store.advance_after("save", clock.clone(), secs(2.0));
    let lock = factory.create_lock("r").with_ttl(Some(secs(1.0)));
    let err = lock.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Expired, "not wrapped: {err:?}");
    assert!(store.op_names().contains(&"delete".to_owned()));
    assert!(!lock.is_acquired().await.unwrap(), "never reported held");
    assert!(!store.inner().exists(lock.key()).await.unwrap().is_held());

    // Reported even when the delete that takes it back fails.
    store.fail_next("delete", When::Before, Error::storage("delete failed"));
    let err = lock.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Expired);
}

#[tokio::test]
async fn other_acquire_failures_are_wrapped_once_logged_and_taken_back() {
    let capture = Capture::default();
    let _log = capture.install();
    let store = Scripted::new(InMemoryStore::new());
    let (factory, _) = manual(store.clone());
    let lock = factory.create_lock("r");
    // The store applied the save, then the reply was lost: what it stored must not leak.
    store.fail_next(
        "save",
        When::After,
        Error::storage("connection reset").temporary(),
    );
    let err = lock.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Acquiring);
    assert_eq!(err.to_string(), "lock 'r': failed to acquire the lock");
    assert!(err.is_temporary(), "the hint carries over");
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert_eq!(source, "connection reset");
    // The take-back runs before the holder's next operation.
    assert!(!lock.is_acquired().await.unwrap());
    assert!(
        !store.inner().exists(lock.key()).await.unwrap().is_held(),
        "nothing left stored"
    );
    assert!(factory.create_lock("r").try_acquire().await.unwrap());
    let warns: Vec<_> = capture
        .records()
        .into_iter()
        .filter(|r| r.level == tracing::Level::WARN && r.message == "failed to acquire the lock")
        .collect();
    assert_eq!(warns.len(), 1);
    assert_eq!(warns[0].fields["resource"], "r");
    assert_eq!(warns[0].fields["error"], "connection reset");
    assert_eq!(warns[0].target, "xtr_lock");
}

#[tokio::test]
async fn two_tasks_acquiring_one_shared_lock_both_get_it() {
    let (factory, _) = manual(Arc::new(InMemoryStore::new()));
    let lock = factory.create_lock("r");
    let (a, b) = tokio::join!(lock.try_acquire(), lock.try_acquire());
    assert!(a.unwrap() && b.unwrap());
    assert!(lock.is_acquired().await.unwrap());
}

#[tokio::test]
async fn a_waiters_lifetime_starts_when_it_wins() {
    // With a deterministic clock: the holder's 0.5 s lock runs out while the waiter polls, and
    // the waiter's lease is the full 0.5 s from the attempt that won (not from when it began
    // waiting, as in the peers).
    let clock = ManualClock::new();
    let store = Arc::new(expiring_memory(&clock));
    let factory = LockFactory::from_arc(store).with_clock(Arc::new(clock.clone()));
    let holder = factory.create_lock("r").with_ttl(Some(secs(0.5)));
    holder.acquire().await.unwrap();
    let waiter = factory.create_lock("r").with_ttl(Some(secs(0.5)));
    waiter.acquire().await.unwrap();
    assert!(
        clock.elapsed() >= secs(0.5),
        "the waiter waited {:?}",
        clock.elapsed()
    );
    assert_eq!(waiter.remaining_lifetime(), Some(secs(0.5)));
    assert!(!holder.is_acquired().await.unwrap());
}

#[tokio::test]
async fn the_expiration_matrix_holds_on_the_factory_clock() {
    for (ttl, elapsed, expired) in [
        (5.0, 0.0, false),
        (5.0, 4.999, false),
        (5.0, 5.0, true),
        (5.0, 6.0, true),
        (0.5, 0.25, false),
        (0.5, 0.75, true),
    ] {
        let clock = ManualClock::new();
        let factory = LockFactory::from_arc(Arc::new(expiring_memory(&clock)))
            .with_clock(Arc::new(clock.clone()));
        let lock = factory.create_lock("r").with_ttl(Some(secs(ttl)));
        lock.try_acquire().await.unwrap();
        clock.advance(secs(elapsed));
        assert_eq!(lock.is_expired(), expired, "ttl {ttl} after {elapsed}");
        assert_eq!(
            lock.is_acquired().await.unwrap(),
            !expired,
            "ttl {ttl} after {elapsed}"
        );
        let left = lock.remaining_lifetime().unwrap();
        assert_eq!(left, secs(ttl).saturating_sub(secs(elapsed)));
    }
}

// ---- read locks ---------------------------------------------------------------------------

#[tokio::test]
async fn acquire_read_uses_save_read_on_shared_stores() {
    let capture = Capture::default();
    let _log = capture.install();
    let store = Scripted::new(InMemoryStore::new());
    let (factory, _) = manual(store.clone());
    let lock = factory.create_lock("r");
    assert!(lock.try_acquire_read().await.unwrap());
    assert_eq!(store.op_names(), ["save_read"]);
    assert_eq!(lock.held_mode(), Some(Mode::Read));
    assert!(
        capture
            .records()
            .iter()
            .any(|r| r.level == tracing::Level::DEBUG
                && r.message == "acquired the lock for reading")
    );
}

#[tokio::test]
async fn acquire_read_falls_back_to_write_on_stores_without_shared_locks() {
    let capture = Capture::default();
    let _log = capture.install();
    let store = Scripted::with_caps(InMemoryStore::new(), |mut c| {
        c.shared = false;
        c
    });
    let (factory, _) = manual(store.clone());
    let lock = factory.create_lock("r");
    assert!(lock.try_acquire_read().await.unwrap());
    assert_eq!(store.op_names(), ["save"]);
    assert_eq!(lock.held_mode(), Some(Mode::Write));
    assert!(
        capture
            .records()
            .iter()
            .any(|r| r.level == tracing::Level::DEBUG
                && r.message == "store does not support read locks, falling back to a write lock")
    );
}

#[tokio::test]
async fn read_conflicts_return_false_or_wait_and_other_failures_are_wrapped() {
    let (factory, _) = manual(Arc::new(InMemoryStore::new()));
    let writer = factory.create_lock("r");
    writer.acquire().await.unwrap();
    let reader = factory.create_lock("r");
    assert!(!reader.try_acquire_read().await.unwrap());
    assert!(!reader.acquire_read_timeout(secs(1.0)).await.unwrap());

    let store = Scripted::new(InMemoryStore::new());
    let (factory, _) = manual(store.clone());
    store.fail_next("save_read", When::Before, Error::storage("boom"));
    let err = factory
        .create_lock("r")
        .try_acquire_read()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Acquiring);
}
