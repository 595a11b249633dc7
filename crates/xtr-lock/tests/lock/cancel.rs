//! Cancellation: every acquire path, dropped while the store has applied the save but its
//! reply is still "in flight", leaves nothing held; a holder that held before keeps its lock;
//! a scope dropped while its body runs releases.

use std::time::Duration;

use xtr_lock::store::Capabilities;
use xtr_lock::{
    BoxFuture, Error, InMemoryStore, Lock, LockFactory, Lockable, Mode, Release, RunOptions, Store,
    Wait,
};

use crate::support::Scripted;

const IN_FLIGHT: Duration = Duration::from_millis(50);

fn plain(c: Capabilities) -> Capabilities {
    c
}

/// Native waits, and keys that stay in the process (as flock's): the wait is the first call.
fn native(mut c: Capabilities) -> Capabilities {
    c.blocking = true;
    c.blocking_shared = true;
    c.serializable_keys = false;
    c
}

/// Drops `path` while the reply of `op` is held, then checks that nothing is left.
async fn dropped_in_flight_leaves_nothing(
    op: &'static str,
    caps: fn(Capabilities) -> Capabilities,
    path: impl Fn(Lock) -> BoxFuture<'static, ()>,
) {
    let store = Scripted::with_caps(InMemoryStore::new(), caps);
    let factory = LockFactory::from_arc(store.clone()).with_ttl(None);
    let lock = factory.create_lock("r");
    store.hold_replies(op);
    let outcome = tokio::time::timeout(IN_FLIGHT, path(lock.clone())).await;
    assert!(outcome.is_err(), "{op}: the acquire was still in flight");
    assert!(
        store.inner().exists(lock.key()).await.unwrap().is_held()
            || store.op_names().contains(&"delete".into()),
        "{op}: the store had applied the save (or it was already taken back)"
    );
    // The save runs to its end (its reply arrives), and the take-back is ordered before the
    // holder's next operation.
    store.release_replies();
    assert!(
        !lock.is_acquired().await.unwrap(),
        "{op}: the holder holds nothing"
    );
    assert_eq!(lock.held_mode(), None);
    assert!(
        !store.inner().exists(lock.key()).await.unwrap().is_held(),
        "{op}: nothing stored"
    );
    assert!(
        store.op_names().contains(&"delete".to_owned()),
        "{op}: {:?}",
        store.ops()
    );
    let other = factory.create_lock("r");
    assert!(
        other.try_acquire().await.unwrap(),
        "{op}: another holder gets the lock"
    );
}

fn boxed<F: Future<Output = xtr_lock::Result<T>> + Send + 'static, T>(
    f: F,
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let _ = f.await;
    })
}

#[tokio::test]
async fn try_acquire() {
    dropped_in_flight_leaves_nothing("save", plain, |l| {
        boxed(async move { l.try_acquire().await })
    })
    .await;
}

#[tokio::test]
async fn acquire() {
    dropped_in_flight_leaves_nothing("save", plain, |l| boxed(async move { l.acquire().await }))
        .await;
}

#[tokio::test]
async fn acquire_timeout() {
    dropped_in_flight_leaves_nothing("save", plain, |l| {
        boxed(async move { l.acquire_timeout(Duration::from_secs(60)).await })
    })
    .await;
}

#[tokio::test]
async fn try_acquire_read() {
    dropped_in_flight_leaves_nothing("save_read", plain, |l| {
        boxed(async move { l.try_acquire_read().await })
    })
    .await;
}

#[tokio::test]
async fn acquire_read() {
    dropped_in_flight_leaves_nothing("save_read", plain, |l| {
        boxed(async move { l.acquire_read().await })
    })
    .await;
}

#[tokio::test]
async fn acquire_read_timeout() {
    dropped_in_flight_leaves_nothing("save_read", plain, |l| {
        boxed(async move { l.acquire_read_timeout(Duration::from_secs(60)).await })
    })
    .await;
}

#[tokio::test]
async fn acquire_with_every_wait() {
    for wait in [
        Wait::Never,
        Wait::AtMost(Duration::ZERO),
        Wait::AtMost(Duration::from_secs(60)),
        Wait::Forever,
    ] {
        for (op, mode) in [("save", Mode::Write), ("save_read", Mode::Read)] {
            dropped_in_flight_leaves_nothing(op, plain, move |l| {
                boxed(async move { l.acquire_with(mode, wait).await })
            })
            .await;
        }
    }
}

#[tokio::test]
async fn native_wait() {
    dropped_in_flight_leaves_nothing("wait_and_save", native, |l| {
        boxed(async move { l.acquire().await })
    })
    .await;
}

#[tokio::test]
async fn native_read_wait() {
    dropped_in_flight_leaves_nothing("wait_and_save_read", native, |l| {
        boxed(async move { l.acquire_read().await })
    })
    .await;
}

#[tokio::test]
async fn guard() {
    dropped_in_flight_leaves_nothing("save", plain, |l| {
        boxed(async move { l.lock().await.map(LockGuardExt::forget_release) })
    })
    .await;
}

#[tokio::test]
async fn scoped() {
    dropped_in_flight_leaves_nothing("save", plain, |l| {
        boxed(async move { l.scoped(async { Ok::<_, Error>(()) }).await })
    })
    .await;
}

#[tokio::test]
async fn scoped_on_a_dyn_lockable() {
    dropped_in_flight_leaves_nothing("save", plain, |l| {
        boxed(async move {
            let l: &dyn Lockable = &l;
            l.scoped(async { Ok::<_, Error>(()) }).await
        })
    })
    .await;
}

#[tokio::test]
async fn factory_run() {
    let store = Scripted::new(InMemoryStore::new());
    let factory = LockFactory::from_arc(store.clone());
    store.hold_replies("save");
    let run = factory.run(
        "r",
        RunOptions::new().wait(Wait::AtMost(Duration::from_secs(60))),
        || async { Ok::<_, Error>(()) },
    );
    assert!(tokio::time::timeout(IN_FLIGHT, run).await.is_err());
    store.release_replies();
    let other = factory.create_lock("r");
    tokio::time::timeout(Duration::from_secs(10), other.acquire())
        .await
        .expect("the cancelled run left nothing behind")
        .unwrap();
}

#[tokio::test]
async fn an_unlock_dropped_in_flight_still_releases() {
    let store = Scripted::new(InMemoryStore::new());
    let factory = LockFactory::from_arc(store.clone()).with_ttl(None);
    let lock = factory.create_lock("r");
    let guard = lock.lock().await.unwrap();
    store.hold_requests("delete");
    assert!(
        tokio::time::timeout(IN_FLIGHT, guard.unlock())
            .await
            .is_err(),
        "the release was in flight"
    );
    store.release_replies();
    let other = factory.create_lock("r");
    tokio::time::timeout(Duration::from_secs(10), other.acquire())
        .await
        .expect("the dropped unlock's release was scheduled")
        .unwrap();
    assert_eq!(lock.held_mode(), None);
}

/// Keeps the `guard` path's lock from being released by the guard itself.
trait LockGuardExt {
    fn forget_release(self);
}

impl LockGuardExt for xtr_lock::LockGuard {
    fn forget_release(self) {
        let _ = self.keep();
    }
}

#[tokio::test]
async fn a_cancelled_reacquire_keeps_what_the_holder_held() {
    let store = Scripted::new(InMemoryStore::new());
    let factory = LockFactory::from_arc(store.clone()).with_ttl(None);
    let lock = factory.create_lock("r");
    lock.acquire().await.unwrap();
    store.hold_replies("save");
    assert!(
        tokio::time::timeout(IN_FLIGHT, lock.acquire())
            .await
            .is_err()
    );
    // Demotion in flight, dropped: also kept.
    store.hold_replies("save_read");
    assert!(
        tokio::time::timeout(IN_FLIGHT, lock.acquire_read())
            .await
            .is_err()
    );
    store.release_replies();
    assert!(lock.is_acquired().await.unwrap(), "still held");
    assert!(
        !store.op_names().contains(&"delete".to_owned()),
        "{:?}",
        store.ops()
    );
}

#[tokio::test]
async fn a_scope_dropped_while_its_body_runs_releases() {
    let factory = LockFactory::new(InMemoryStore::new());
    let lock = factory.create_lock("r");
    let body = lock.scoped(async {
        std::future::pending::<()>().await;
        Ok::<_, Error>(())
    });
    assert!(tokio::time::timeout(IN_FLIGHT, body).await.is_err());
    assert!(!lock.is_acquired().await.unwrap(), "released on drop");
    assert!(factory.create_lock("r").try_acquire().await.unwrap());
}

#[tokio::test]
async fn a_scope_nested_in_a_held_lock_keeps_it_when_dropped() {
    let factory = LockFactory::new(InMemoryStore::new());
    let lock = factory.create_lock("r");
    lock.acquire().await.unwrap();
    let body = lock.scoped(async {
        std::future::pending::<()>().await;
        Ok::<_, Error>(())
    });
    assert!(tokio::time::timeout(IN_FLIGHT, body).await.is_err());
    assert!(
        lock.is_acquired().await.unwrap(),
        "the outer holder keeps it"
    );
}

#[tokio::test]
async fn two_waiters_on_one_holder_cancelled_leave_nothing_behind() {
    let factory = LockFactory::new(InMemoryStore::new());
    let holder = factory.create_lock("r");
    holder.acquire().await.unwrap();
    let waiter = factory.create_lock("r");
    let (a, b) = tokio::join!(
        tokio::time::timeout(IN_FLIGHT, waiter.acquire()),
        tokio::time::timeout(IN_FLIGHT * 2, waiter.acquire()),
    );
    assert!(a.is_err() && b.is_err());
    assert_eq!(holder.release().await.unwrap(), Release::Released);
    assert!(!waiter.is_acquired().await.unwrap());
    assert!(factory.create_lock("r").try_acquire().await.unwrap());
}

#[tokio::test]
async fn a_cancelled_waiter_does_not_undo_a_sibling_that_got_the_lock() {
    // Two acquires of one holder wait; when one gets the lock, the other is dropped: the holder
    // keeps the lock (the sibling's acquisition is not taken back).
    let factory = LockFactory::new(InMemoryStore::new());
    let holder = factory.create_lock("r");
    holder.acquire().await.unwrap();
    let waiter = factory.create_lock("r");
    let releaser = async {
        tokio::time::sleep(IN_FLIGHT).await;
        let _ = holder.release().await.unwrap();
        std::future::pending::<()>().await
    };
    tokio::select! {
        r = waiter.acquire() => r.unwrap(),
        r = waiter.acquire_read() => r.unwrap(),
        () = releaser => unreachable!(),
    }
    assert!(
        waiter.is_acquired().await.unwrap(),
        "the sibling's drop took nothing back"
    );
    assert!(waiter.held_mode().is_some());
    assert!(!factory.create_lock("r").try_acquire().await.unwrap());
}

/// Issue 30's sibling race, made deterministic: sibling A's native wait times out while
/// sibling B (same holder) waits; the clean-up A leaves must never take away what B is
/// granted after it (before, A's delete was decided before B's grant and sent after it).
#[tokio::test]
async fn a_timed_out_native_wait_never_takes_back_a_siblings_later_grant() {
    let memory = InMemoryStore::new();
    let store = Scripted::with_caps(memory.clone(), native);
    let lock = LockFactory::from_arc(store.clone())
        .with_ttl(None)
        .create_lock("r");
    // The other holder goes straight to the memory store: its calls are not held.
    let direct = LockFactory::new(memory.clone()).with_ttl(None);
    let other = direct.create_lock("r");
    other.acquire().await.unwrap();
    // A delete of this holder, if any, is held in flight until B has been granted.
    store.hold_requests("delete");
    let a = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire_timeout(Duration::from_millis(200)).await }
    });
    // B comes once A waits in the store.
    tokio::time::timeout(Duration::from_secs(10), async {
        while !store.op_names().contains(&"wait_and_save".to_owned()) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("A waits in the store");
    let b = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    assert!(!a.await.unwrap().unwrap(), "A timed out");
    let _ = other.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("B is granted once the other holder released")
        .unwrap()
        .unwrap();
    store.release_replies();
    assert!(xtr_lock::settle(Duration::from_secs(5)).await);
    assert_eq!(lock.held_mode(), Some(Mode::Write));
    assert!(
        memory.exists(lock.key()).await.unwrap().is_held(),
        "the store still holds B's grant: {:?}",
        store.ops()
    );
    assert!(
        !direct.create_lock("r").try_acquire().await.unwrap(),
        "nobody else gets it while B holds"
    );
    assert!(lock.release().await.unwrap() == Release::Released);
}
