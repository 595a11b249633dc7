//! FlockStore's holder records and listing with other processes on the same directory:
//! `flock(1)` holders are listed with their pids, `flock(1)` and we still exclude each other
//! while our records exist, and a killed holder's record is never shown.

#![cfg(target_os = "linux")]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use xtr_lock::store::Listing;
use xtr_lock::{FlockStore, Key, LockFactory, Lockable as _, Store};

use super::flock::FlockHolder;
use crate::support::holder_process;

const PATIENCE: Duration = Duration::from_secs(10);

/// The live record files in the records' directory (a free one, kept for reuse, starts with
/// `-`).
fn records(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir.join(".xtr-holders")) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| !std::fs::read(p).unwrap().starts_with(b"-"))
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .collect()
}

fn flock_n(mode: &str, file: &Path) -> bool {
    Command::new("flock")
        .args(["-n", mode])
        .arg(file)
        .arg("true")
        .status()
        .expect("flock(1) from util-linux")
        .success()
}

fn find<'a>(listed: &'a [Listing], resource: &str) -> &'a Listing {
    listed
        .iter()
        .find(|l| l.resource == resource)
        .unwrap_or_else(|| panic!("{resource} not listed: {listed:#?}"))
}

#[tokio::test]
async fn a_flock_1_holder_is_listed_with_its_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    // A name its file name tells exactly, and one it does not (':' is folded).
    let plain = FlockHolder::holding(&store, "jobs.nightly", "-x").await;
    let folded = FlockHolder::holding(&store, "jobs:weekly", "-s").await;
    let ours = LockFactory::new(store.clone())
        .create_lock("jobs:daily")
        .with_meta(b"host=a".to_vec())
        .unwrap();
    assert!(ours.try_acquire().await.unwrap());

    let listed = store.list("jobs").await.unwrap();
    assert_eq!(listed.len(), 3, "{listed:#?}");
    let l = find(&listed, "jobs.nightly");
    assert_eq!(l.holders.len(), 1);
    assert_eq!(l.holders[0].pid, Some(plain.id()));
    assert_eq!(l.holders[0].meta, None, "flock(1) keeps no record");
    let file = store.path_for("jobs:weekly");
    let file_name = file.file_name().unwrap().to_str().unwrap();
    let l = find(&listed, file_name);
    assert_eq!(l.holders[0].pid, Some(folded.id()), "{l:?}");
    assert_eq!(l.holders[0].mode, xtr_lock::Mode::Read);
    let l = find(&listed, "jobs:daily");
    assert_eq!(l.holders[0].pid, Some(std::process::id()));
    assert_eq!(l.holders[0].meta.as_deref(), Some(&b"host=a"[..]));
    assert!(l.holders[0].acquired_at.is_some());

    let under = store.list("jobs:").await.unwrap();
    let names: Vec<_> = under.iter().map(|l| l.resource.as_str()).collect();
    assert!(
        names.contains(&"jobs:daily") && names.contains(&file_name),
        "a file whose name may be under the prefix is shown: {names:?}"
    );
    assert!(!names.contains(&"jobs.nightly"), "{names:?}");
    assert!(store.list("other").await.unwrap().is_empty());
    let _ = ours.release().await.unwrap();
}

#[tokio::test]
async fn flock_1_still_excludes_us_both_ways_while_our_records_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    let factory = LockFactory::new(store.clone());
    let lock = factory
        .create_lock("shared-file")
        .with_meta(b"job=1".to_vec())
        .unwrap();
    let file = store.path_for("shared-file");
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(records(tmp.path()).len(), 1, "our record is kept");
    assert!(!flock_n("-x", &file), "our write lock excludes flock -x");
    assert!(!flock_n("-s", &file), "and flock -s");
    lock.try_acquire_read().await.unwrap();
    assert_eq!(records(tmp.path()).len(), 1, "a re-save rewrites it");
    assert!(flock_n("-s", &file), "our read lock admits flock -s");
    assert!(!flock_n("-x", &file));
    let _ = lock.release().await.unwrap();
    assert!(records(tmp.path()).is_empty(), "released, the record goes");
    assert!(flock_n("-x", &file));

    // Another of our holders keeps a record while flock(1) holds our file.
    let other = factory
        .create_lock("elsewhere")
        .with_meta(b"x".to_vec())
        .unwrap();
    assert!(other.try_acquire().await.unwrap());
    let holder = FlockHolder::holding(&store, "shared-file", "-x").await;
    assert!(!lock.try_acquire().await.unwrap(), "flock(1) excludes us");
    assert!(!lock.try_acquire_read().await.unwrap());
    let holders = store.holders("shared-file").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(
        (holders[0].pid, holders[0].meta.as_ref()),
        (Some(holder.id()), None)
    );
    drop(holder);
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(records(tmp.path()).len(), 2);
    // The records' directory is nobody's lock file: flock(1) and the listing pass it by.
    let listed = store.list("").await.unwrap();
    let mut names: Vec<_> = listed.iter().map(|l| l.resource.clone()).collect();
    names.sort();
    assert_eq!(names, ["elsewhere", "shared-file"], "{listed:#?}");
    for l in [lock, other] {
        let _ = l.release().await.unwrap();
    }
    assert!(records(tmp.path()).is_empty());
}

/// The holder process of the next test: this test binary run again with
/// `XTR_FLOCK_RECORD_DIR` set, holding a lock with metadata, saying so, and sleeping until
/// killed.
#[tokio::test]
#[ignore = "the holder process of a_killed_holders_record_is_not_shown"]
async fn flock_record_holder_process() {
    let dir = std::env::var("XTR_FLOCK_RECORD_DIR").expect("run by the test that kills it");
    let store = FlockStore::in_dir(dir).unwrap();
    let lock = LockFactory::new(store)
        .create_lock("killed")
        .with_meta(b"the killed one".to_vec())
        .unwrap();
    assert!(lock.try_acquire().await.unwrap());
    println!("held");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[tokio::test]
async fn a_killed_holders_record_is_not_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    let mut child = holder_process::start(
        "flock_listing::flock_record_holder_process",
        "XTR_FLOCK_RECORD_DIR",
        tmp.path(),
    );
    let holders = store.holders("killed").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].pid, Some(child.id()));
    assert_eq!(holders[0].meta.as_deref(), Some(&b"the killed one"[..]));
    let stale = records(tmp.path());
    assert_eq!(stale.len(), 1, "{stale:?}");

    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + PATIENCE;
    while !store.holders("killed").await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the kernel never let go");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let side = tmp.path().join(".xtr-holders");
    let content = std::fs::read(side.join(&stale[0])).unwrap();
    assert!(store.list("").await.unwrap().is_empty(), "nobody holds");
    assert!(
        !side.join(&stale[0]).exists(),
        "the dead process's record was pruned"
    );

    // Its record, put back as it was, is not taken for a new holder's.
    std::fs::write(side.join(&stale[0]), content).unwrap();
    let key = Key::new("killed");
    let lock = LockFactory::new(store.clone()).create_lock_from_key(key);
    assert!(lock.try_acquire().await.unwrap());
    let listed = store.list("").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:#?}");
    let h = &listed[0].holders;
    assert_eq!((h.len(), h[0].pid), (1, Some(std::process::id())), "{h:?}");
    assert_eq!(h[0].meta, None, "not the killed holder's: {h:?}");
    assert!(!side.join(&stale[0]).exists(), "pruned again");
    let _ = lock.release().await.unwrap();
}
