//! Unit tests of the flock store's waiting schedule.

use super::*;

#[test]
fn without_close_events_waiters_back_off_like_the_python_peer() {
    let ms = |x: f64| Duration::from_secs_f64(x / 1000.0);
    let bounds = [
        (10.0, 11.0),
        (20.0, 22.0),
        (40.0, 44.0),
        (80.0, 88.0),
        (100.0, 110.0),
        (100.0, 110.0),
    ];
    for _ in 0..200 {
        for (tries, (lo, hi)) in bounds.iter().enumerate() {
            let d = backoff(false, DEFAULT_POLL, tries as u32);
            assert!(d >= ms(*lo) && d <= ms(*hi), "try {tries}: {d:?}");
        }
    }
}

#[test]
fn with_close_events_the_poll_is_only_a_safety_net() {
    for tries in 0..10 {
        let d = backoff(true, DEFAULT_POLL, tries);
        assert!(
            d >= Duration::from_millis(90) && d <= Duration::from_millis(110),
            "{d:?}"
        );
    }
}

#[tokio::test]
async fn the_directory_is_watched_only_while_a_refused_waiter_waits() {
    let dir = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(dir.path()).unwrap();
    let hub = store.inner.hub.clone();
    assert!(hub.observes_other_processes(), "this test needs inotify");
    // A blocking acquire of a free lock is a try: no watch (it would cost every open and
    // close in the directory an event).
    let holder = Key::new("w");
    assert!(
        store
            .wait_and_save(&holder, None)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(!hub.watches_closes(), "a free lock: no watch");
    // A refused waiter watches until it gets in, and no longer.
    let waiter = Key::new("w");
    let waiting = {
        let store = store.clone();
        let waiter = waiter.clone();
        tokio::spawn(async move { store.wait_and_save(&waiter, None).await })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !hub.watches_closes() {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never watched"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(store.delete(&holder).await.unwrap());
    assert!(waiting.await.unwrap().unwrap().is_acquired());
    assert!(!hub.watches_closes(), "the last waiter left: no watch");
    assert!(store.delete(&waiter).await.unwrap());
}

/// Waits until `n` waiters of this process stand in the directory's lines.
async fn in_line(store: &FlockStore, n: usize) {
    let lines = store.inner.hub.lines().clone();
    tokio::time::timeout(Duration::from_secs(10), async move {
        while lines.waiting() != n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the waiters stand in line");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_waiters_get_in_in_order_and_a_writer_is_not_starved() {
    let dir = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(dir.path()).unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let spawn = |i: usize, read: bool| {
        let (store, order) = (store.clone(), order.clone());
        tokio::spawn(async move {
            let key = Key::new("r");
            let saved = match read {
                true => store.wait_and_save_read(&key, None).await.unwrap(),
                false => store.wait_and_save(&key, None).await.unwrap(),
            };
            assert!(saved.is_acquired());
            order.lock().unwrap().push(i);
            tokio::task::yield_now().await;
            assert!(store.delete(&key).await.unwrap());
        })
    };
    // Writers in line behind a writer get in in the order they came.
    let holder = Key::new("r");
    assert!(store.save(&holder, None).await.unwrap().is_acquired());
    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push(spawn(i, false));
        in_line(&store, i + 1).await;
    }
    assert!(store.delete(&holder).await.unwrap());
    for t in tasks.drain(..) {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
    // A writer behind a reader: later readers, and a newcomer's try, wait behind it.
    order.lock().unwrap().clear();
    assert!(store.save_read(&holder, None).await.unwrap().is_acquired());
    tasks.push(spawn(0, false));
    in_line(&store, 1).await;
    let newcomer = Key::new("r");
    assert!(
        !store
            .save_read(&newcomer, None)
            .await
            .unwrap()
            .is_acquired()
    );
    for i in 1..4 {
        tasks.push(spawn(i, true));
        in_line(&store, i + 1).await;
    }
    assert!(store.delete(&holder).await.unwrap());
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(order.lock().unwrap()[0], 0, "the writer first");
    assert_eq!(store.inner.hub.lines().waiting(), 0, "nobody left in line");
}

// Paused: the hub's first second (when observers make no watch) lasts as long as the test needs.
#[tokio::test(start_paused = true)]
async fn a_holder_that_never_waits_starts_no_inotify() {
    // A process that had an inotify mark waits for the kernel to retire it at its exit: `run
    // r -- true` must not pay for one. Acquiring (a fresh file and an existing one), holding
    // with a loss watcher and a look-out for a revocation notice (an observer) for less than
    // a second, and releasing start nothing.
    let dir = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(dir.path()).unwrap();
    let hub = store.inner.hub.clone();
    for _ in 0..2 {
        let key = Key::new("fresh");
        assert!(store.wait_and_save(&key, None).await.unwrap().is_acquired());
        let observer = store.watch_changes("fresh#xtr-revoke").await.unwrap();
        let watcher = store
            .watch_loss(&key)
            .await
            .unwrap()
            .expect("flock watches");
        let watching = tokio::time::timeout(Duration::from_millis(150), watcher).await;
        assert!(watching.is_err(), "held all along: no loss");
        drop(observer);
        assert!(store.delete(&key).await.unwrap());
    }
    assert!(!hub.inotify_started(), "no listener: no inotify instance");
    // An early observer still sees this process's changes.
    let observer = store.watch_changes("fresh").await.unwrap().unwrap();
    let key = Key::new("fresh");
    assert!(store.wait_and_save(&key, None).await.unwrap().is_acquired());
    tokio::time::timeout(Duration::from_millis(100), observer)
        .await
        .expect("an acquisition in this process wakes an early observer");
    assert!(store.delete(&key).await.unwrap());
    assert!(!hub.inotify_started());
    // The first waiter starts it.
    let holder = Key::new("w");
    assert!(
        store
            .wait_and_save(&holder, None)
            .await
            .unwrap()
            .is_acquired()
    );
    let _changes = hub.subscribe("xtr.w.lock");
    assert!(hub.inotify_started());
    assert_eq!(store.inner.hub.observes_if_known(), Some(true));
    assert!(store.delete(&holder).await.unwrap());
}
