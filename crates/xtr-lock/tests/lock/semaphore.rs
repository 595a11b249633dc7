//! The semaphore front end beyond the conformance suite: argument checks, no shared mode, a
//! lock's key refused, loss reported to a guard, the blocking facade, keys that travel with
//! their permits checked.

use std::time::Duration;

use xtr_lock::{ErrorKind, InMemoryStore, Key, LockFactory, Lockable as _, Permits, Release};

fn factory() -> LockFactory {
    LockFactory::new(InMemoryStore::new())
}

#[test]
fn limits_and_counts_out_of_bounds_are_refused_naming_the_value() {
    let f = factory();
    for limit in [0, 1001] {
        let e = f.create_semaphore("s", limit).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains(&limit.to_string()), "{e}");
    }
    let s = f.create_semaphore("s", 3).unwrap();
    for count in [0, 4] {
        let e = s.clone().permits(count).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains(&count.to_string()), "{e}");
    }
    assert_eq!(s.permits(3).unwrap().count(), 3);
}

#[tokio::test]
async fn permits_have_no_shared_mode_and_a_locks_key_is_no_semaphore() {
    let f = factory();
    let s = f.create_semaphore("s", 2).unwrap();
    let e = s.as_lock().try_acquire_read().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(!s.is_acquired().await.unwrap(), "nothing was taken");
    let e = f.create_semaphore_from_key(f.new_key("s")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}

#[tokio::test]
async fn permits_removed_behind_a_guards_back_are_reported_lost() {
    let f = factory();
    let s = f.create_semaphore("s", 2).unwrap().permits(2).unwrap();
    let guard = s.lock().await.unwrap();
    // The guard's holder: `lock()` takes the permits with a new one.
    let copy = Key::from_json(&guard.lock().key().to_json().unwrap()).unwrap();
    assert!(f.store().delete(&copy).await.unwrap());
    let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the loss is reported at once on a store that observes it");
    assert!(lost.to_string().contains('s'), "{lost}");
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);
}

#[test]
fn a_travelled_key_with_bad_permits_is_refused() {
    let good = Key::for_semaphore("s", Permits::new(3, 2).unwrap())
        .to_json()
        .unwrap();
    assert!(good.contains("\"permits\""), "{good}");
    let bad = good.replace("\"count\":2", "\"count\":9");
    let e = Key::from_json(&bad).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains('9'), "{e}");
}

#[test]
fn the_blocking_semaphore_counts_and_refuses_inside_a_runtime() {
    let f = xtr_lock::blocking::LockFactory::from_dsn("in-memory").unwrap();
    let a = f.create_semaphore("b", 2).unwrap();
    let b = f.create_semaphore("b", 2).unwrap();
    let c = f.create_semaphore("b", 2).unwrap();
    assert!(a.try_acquire().unwrap() && b.try_acquire().unwrap());
    assert!(!c.acquire_timeout(Duration::from_millis(50)).unwrap());
    assert_eq!(c.usage().unwrap().used, 2);
    assert_eq!(a.release().unwrap(), Release::Released);
    assert_eq!(c.scoped(|| Ok::<_, xtr_lock::Error>(5)).unwrap(), 5);
    let options = xtr_lock::RunOptions::new().wait(xtr_lock::Wait::Never);
    assert_eq!(c.run(options, || Ok::<_, xtr_lock::Error>(6)).unwrap(), 6);
    let travelled = Key::from_json(&b.key().to_json().unwrap()).unwrap();
    let there = f.create_semaphore_from_key(travelled).unwrap();
    assert!(there.is_acquired().unwrap());
    assert_eq!(there.release().unwrap(), Release::Released);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let e = rt.block_on(async { c.try_acquire() }).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
}

#[tokio::test]
async fn a_travelled_key_whose_count_was_edited_is_refused_and_reads_are_refused_by_the_store() {
    let f = factory();
    let a = f.create_semaphore("e", 3).unwrap();
    assert!(a.try_acquire().await.unwrap());
    let edited = a
        .key()
        .to_json()
        .unwrap()
        .replace("\"count\":1", "\"count\":3");
    let copy = f
        .create_semaphore_from_key(Key::from_json(&edited).unwrap())
        .unwrap();
    let e = copy.try_acquire().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(
        e.to_string().contains("holds 1 permits and asks for 3"),
        "{e}"
    );
    assert_eq!(a.usage().await.unwrap().used, 1);
    let e = f.store().save_read(a.key(), None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}

#[tokio::test]
async fn permits_cannot_change_count_while_held() {
    let f = factory();
    let s = f.create_semaphore("c", 3).unwrap();
    assert!(s.try_acquire().await.unwrap());
    let e = s.clone().permits(2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let _ = s.release().await.unwrap();
    assert_eq!(s.permits(2).unwrap().count(), 2);
}
