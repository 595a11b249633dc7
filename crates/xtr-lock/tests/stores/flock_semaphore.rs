//! FlockStore's counting semaphores in one process: portalocker's slot files, weights, the
//! stored limit, waking, loss. The tests against portalocker itself are in the `peers` binary.

#![cfg(target_os = "linux")]

use std::path::Path;
use std::time::Duration;

use xtr_lock::{ErrorKind, FlockStore, LockFactory, Lockable as _, LostReason, Release, Semaphore};

use crate::support::root;

/// A factory whose waiters are woken by releases only: the safety-net poll never fires.
fn factory(dir: &Path) -> LockFactory {
    let store = FlockStore::in_dir(dir)
        .unwrap()
        .with_poll_interval(Duration::from_secs(3600));
    LockFactory::new(store)
}

fn sem(factory: &LockFactory, name: &str, limit: u32, count: u32) -> Semaphore {
    factory
        .create_semaphore(name, limit)
        .unwrap()
        .permits(count)
        .unwrap()
}

#[tokio::test]
async fn flock_semaphore_weights_add_up_to_the_limit_in_portalockers_slot_files() {
    let tmp = tempfile::tempdir().unwrap();
    let f = factory(tmp.path());
    let two = sem(&f, "exports", 3, 2);
    assert!(two.try_acquire().await.unwrap());
    assert!(tmp.path().join("exports.00.lock").exists());
    assert!(tmp.path().join("exports.01.lock").exists());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("exports.limit")).unwrap(),
        "3\n"
    );
    let other_two = sem(&f, "exports", 3, 2);
    assert!(!other_two.try_acquire().await.unwrap(), "2 + 2 > 3");
    let one = sem(&f, "exports", 3, 1);
    assert!(one.try_acquire().await.unwrap());
    assert!(!sem(&f, "exports", 3, 1).try_acquire().await.unwrap());
    assert!(one.try_acquire().await.unwrap(), "its holder still holds");
    let usage = one.usage().await.unwrap();
    assert_eq!((usage.used, usage.limit), (3, Some(3)));
    assert_eq!(usage.holders.len(), 1, "one process: {:?}", usage.holders);
    assert_eq!(usage.holders[0].permits, Some(3));
    assert_eq!(usage.holders[0].pid, Some(std::process::id()));
    assert!(matches!(two.release().await.unwrap(), Release::Released));
    assert!(other_two.try_acquire().await.unwrap());
    assert_eq!(one.remaining().await.unwrap(), 0);
    let _ = one.release().await.unwrap();
    assert_eq!(other_two.remaining().await.unwrap(), 1);
    // A lock of the same name is another thing.
    let lock = f.create_lock("exports");
    assert!(lock.try_acquire().await.unwrap());
}

#[tokio::test]
async fn flock_semaphore_limit_binds_while_held_and_changes_once_nobody_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let f = factory(tmp.path());
    let held = sem(&f, "jobs", 3, 1);
    assert!(held.try_acquire().await.unwrap());
    let err = sem(&f, "jobs", 4, 1).try_acquire().await.unwrap_err();
    let err = root(&err);
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("limit of 3") && text.contains("limit of 4"),
        "{text}"
    );
    let _ = held.release().await.unwrap();
    let four = sem(&f, "jobs", 4, 4);
    assert!(four.try_acquire().await.unwrap(), "nobody holds: 4 now");
    assert_eq!(four.usage().await.unwrap().limit, Some(4));
    drop(four);
    // A holder that died (its key dropped: the descriptors closed) binds nobody either.
    assert!(sem(&f, "jobs", 2, 2).try_acquire().await.unwrap());
}

#[tokio::test]
async fn flock_semaphore_a_release_wakes_a_waiter_for_several_permits() {
    let tmp = tempfile::tempdir().unwrap();
    let f = factory(tmp.path());
    let a = sem(&f, "batch", 2, 1);
    let b = sem(&f, "batch", 2, 1);
    assert!(a.try_acquire().await.unwrap() && b.try_acquire().await.unwrap());
    let both = sem(&f, "batch", 2, 2);
    let waiter = tokio::spawn(async move {
        let got = both.acquire_timeout(Duration::from_secs(20)).await.unwrap();
        (got, both)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = a.release().await.unwrap();
    drop(b); // its descriptors close: a release too
    let (got, both) = waiter.await.unwrap();
    assert!(got, "woken by the releases, with the poll off");
    assert_eq!(both.usage().await.unwrap().used, 2);
}

#[tokio::test]
async fn flock_semaphore_a_replaced_slot_file_is_a_lost_permit() {
    let tmp = tempfile::tempdir().unwrap();
    let f = factory(tmp.path());
    let s = sem(&f, "cleanup", 2, 2);
    assert!(s.try_acquire().await.unwrap());
    let slot = tmp.path().join("cleanup.01.lock");
    std::fs::remove_file(&slot).unwrap();
    std::fs::File::create(&slot).unwrap();
    assert!(!s.is_acquired().await.unwrap());
    assert_eq!(s.lost_reason(), Some(LostReason::Replaced));
    // Both slots were let go of: another holder gets both.
    assert!(sem(&f, "cleanup", 2, 2).try_acquire().await.unwrap());
}

#[tokio::test]
async fn flock_semaphore_names_that_cannot_name_a_file_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let f = factory(tmp.path());
    for name in ["a/b", "nul\0", &"x".repeat(300)] {
        let err = sem(&f, name, 2, 1).try_acquire().await.unwrap_err();
        assert_eq!(root(&err).kind(), ErrorKind::InvalidArgument, "{err}");
    }
}
