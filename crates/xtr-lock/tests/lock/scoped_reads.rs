//! Read-side scopes (`lock_read`, `scoped_read`, `run_read`) and scopes on a generic
//! `L: Lockable` (`LockableExt`), spawned on a multi-threaded runtime.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use xtr_lock::config::{Locks, LocksConfig};
use xtr_lock::{
    ErrorKind, InMemoryStore, LockFactory, Lockable, LockableExt as _, Mode, Release, Result,
};

/// Generic code: compiles only if `scoped`/`scoped_read` exist on any `L: Lockable`, and spawns
/// only if their futures are `Send` there.
fn spawn_both<L: Lockable + 'static>(lock: Arc<L>) -> tokio::task::JoinHandle<Result<(u32, u32)>> {
    tokio::spawn(async move {
        let w = lock.scoped(async { Ok::<_, xtr_lock::Error>(1) }).await?;
        let r = lock
            .scoped_read(async { Ok::<_, xtr_lock::Error>(2) })
            .await?;
        Ok((w, r))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_code_scopes_any_lockable_and_spawns_it() {
    let factory = LockFactory::new(InMemoryStore::new());
    let lock = Arc::new(factory.create_lock("generic"));
    assert_eq!(spawn_both(lock.clone()).await.unwrap().unwrap(), (1, 2));
    assert!(!lock.is_acquired().await.unwrap());
    // The same on a trait object and on NoLock.
    let dynamic: Arc<dyn Lockable> = Arc::new(factory.create_lock("generic"));
    let n = dynamic
        .scoped_read(async { Ok::<_, xtr_lock::Error>(5) })
        .await
        .unwrap();
    assert_eq!(n, 5);
    assert_eq!(
        spawn_both(Arc::new(xtr_lock::NoLock::new("none")))
            .await
            .unwrap()
            .unwrap(),
        (1, 2)
    );
}

#[tokio::test]
async fn readers_share_a_read_scope_and_a_writer_waits_for_them() {
    let factory = LockFactory::new(InMemoryStore::new());
    let (a, b) = (
        factory.create_lock("catalog"),
        factory.create_lock("catalog"),
    );
    let writer = factory.create_lock("catalog");
    let together = Barrier::new(2);
    let reader = |lock: &xtr_lock::Lock| {
        let together = &together;
        let writer = &writer;
        let lock = lock.clone();
        async move {
            lock.scoped_read(async {
                // Both readers are inside at once, or this waits forever (and the test times out).
                together.wait().await;
                assert_eq!(lock.held_mode(), Some(Mode::Read));
                assert!(
                    !writer.try_acquire().await?,
                    "a writer waits for the readers"
                );
                Ok::<_, xtr_lock::Error>(())
            })
            .await
        }
    };
    let (ra, rb) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(reader(&a), reader(&b))
    })
    .await
    .expect("the readers overlapped");
    ra.unwrap();
    rb.unwrap();
    assert!(writer.try_acquire().await.unwrap(), "both let go");
    let _ = writer.release().await.unwrap();
}

#[tokio::test]
async fn a_read_guard_inside_a_write_hold_does_not_demote_it() {
    let factory = LockFactory::new(InMemoryStore::new());
    let lock = factory.create_lock("report");
    let other = factory.create_lock("report");
    let outer = lock.lock().await.unwrap();
    {
        let inner = lock.lock_read().await.unwrap();
        assert!(!inner.took());
        assert_eq!(lock.held_mode(), Some(Mode::Write));
        assert!(!other.try_acquire_read().await.unwrap(), "still exclusive");
        assert_eq!(inner.unlock().await.unwrap(), Release::Kept);
    }
    assert_eq!(
        lock.held_mode(),
        Some(Mode::Write),
        "the nested guard let nothing go"
    );
    assert_eq!(outer.unlock().await.unwrap(), Release::Released);
    // A read guard that took the lock lets it go.
    let guard = lock.lock_read().await.unwrap();
    assert!(guard.took());
    assert!(other.try_acquire_read().await.unwrap());
    let _ = other.release().await.unwrap();
    assert_eq!(guard.unlock().await.unwrap(), Release::Released);
    assert!(other.try_acquire().await.unwrap());
}

#[tokio::test]
async fn a_read_scope_dropped_while_waiting_leaves_nothing() {
    let factory = LockFactory::new(InMemoryStore::new());
    let writer = factory.create_lock("wait");
    assert!(writer.try_acquire().await.unwrap());
    let reader = factory.create_lock("wait");
    let waited = tokio::time::timeout(
        Duration::from_millis(50),
        reader.scoped_read(async { Ok::<_, xtr_lock::Error>(()) }),
    )
    .await;
    assert!(waited.is_err(), "it waited for the writer");
    let _ = writer.release().await.unwrap();
    assert_eq!(reader.held_mode(), None);
    assert!(factory.create_lock("wait").try_acquire().await.unwrap());
}

#[tokio::test]
async fn run_read_on_a_factory_and_a_registry_shares_the_lock() {
    let factory = LockFactory::new(InMemoryStore::new());
    let together = Barrier::new(2);
    let body = || async {
        together.wait().await;
        Ok::<_, xtr_lock::Error>(())
    };
    let both = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(factory.run_read("r", body), factory.run_read("r", body))
    })
    .await
    .expect("two readers at once");
    both.0.unwrap();
    both.1.unwrap();

    let locks = Locks::new(
        &LocksConfig::from_toml_str(
            "prefix = \"p:\"\nwait = \"0\"\n[stores]\ndefault = \"in-memory\"",
        )
        .unwrap(),
    )
    .unwrap();
    let held = locks.lock("r").unwrap();
    assert!(held.try_acquire_read().await.unwrap());
    locks
        .run_read("r", || async { Ok::<_, xtr_lock::Error>(()) })
        .await
        .unwrap();
    let _ = held.release().await.unwrap();
    assert!(held.try_acquire().await.unwrap());
    let refused = locks
        .run_read("r", || async { Ok::<_, xtr_lock::Error>(()) })
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Conflict);
    assert_eq!(refused.resource(), Some("p:r"));
}
