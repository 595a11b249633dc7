//! FlockStore lock files replaced while held (someone cleaning lock files up): a lost lock, told
//! at once, never claimed by two holders; and descriptors handed to a child.

#![cfg(target_os = "linux")]

use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use xtr_lock::store::Holding;
use xtr_lock::{FlockStore, LockFactory, Lockable as _, LostReason, Mode, Release, Store};

const PATIENCE: Duration = Duration::from_secs(10);

/// A few of the checks a new loss watcher makes of its file (every 100 ms).
const EARLY_CHECKS: Duration = Duration::from_millis(350);

/// Past the first second in which a new loss watcher checks its file itself: from then on only
/// inotify's name events tell it (Linux has them, so nothing polls).
const PAST_EARLY: Duration = Duration::from_millis(1300);

/// Whether `flock(1)` can take `file` at once, in `mode`.
fn flock_1_gets(file: &Path, mode: Mode) -> bool {
    let flag = match mode {
        Mode::Write => "-x",
        Mode::Read => "-s",
    };
    Command::new("flock")
        .args(["-n", flag])
        .arg(file)
        .arg("true")
        .status()
        .expect("flock(1) runs (util-linux)")
        .success()
}

#[tokio::test]
async fn a_replaced_lock_file_is_a_lost_lock_never_claimed() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    let factory = LockFactory::new(store.clone());
    let path = store.path_for("r");
    for replace in ["unlink", "rename over"] {
        let a = factory.create_lock("r");
        assert!(a.try_acquire().await.unwrap());
        match replace {
            "unlink" => fs::remove_file(&path).unwrap(),
            _ => {
                let other = tmp.path().join("other");
                fs::write(&other, b"").unwrap();
                fs::rename(&other, &path).unwrap();
            }
        }
        // Someone else now locks the name: there must never be two holders of it.
        let b = factory.create_lock("r");
        assert!(
            b.try_acquire().await.unwrap(),
            "{replace}: the new file is free"
        );
        assert_eq!(
            store.exists(a.key()).await.unwrap(),
            Holding::NotHeld(LostReason::Replaced),
            "{replace}: the old holder is told"
        );
        assert!(!a.is_acquired().await.unwrap());
        assert_eq!(a.lost_reason(), Some(LostReason::Replaced));
        assert_eq!(a.release().await.unwrap(), Release::Lost, "{replace}");
        assert!(
            !flock_1_gets(&path, Mode::Write),
            "{replace}: b holds the name"
        );
        let _ = b.release().await.unwrap();
        assert!(flock_1_gets(&path, Mode::Write));
    }
}

#[tokio::test]
async fn a_holder_watching_for_loss_is_told_at_once_and_only_about_its_file() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    let factory = LockFactory::new(store.clone());
    let a = factory.create_lock("r");
    assert!(a.try_acquire().await.unwrap());
    let watcher = store
        .watch_loss(a.key())
        .await
        .unwrap()
        .expect("flock observes loss");
    let mut watcher = tokio::spawn(watcher);
    // Other files coming and going, and others opening and closing this one, say nothing.
    let x = factory.create_lock("x");
    assert!(x.try_acquire().await.unwrap());
    fs::remove_file(store.path_for("x")).unwrap();
    assert!(!factory.create_lock("r").try_acquire().await.unwrap());
    assert!(!flock_1_gets(&store.path_for("r"), Mode::Read));
    // A negative needs a window: a few of the checks a new watcher makes.
    tokio::time::sleep(EARLY_CHECKS).await;
    assert!(!watcher.is_finished(), "nothing happened to a's file");
    fs::remove_file(store.path_for("r")).unwrap();
    let reason = tokio::time::timeout(PATIENCE, &mut watcher)
        .await
        .expect("told at once")
        .unwrap();
    assert_eq!(reason, LostReason::Replaced);
    // A guard on a file that goes away reports it too, and its scope's body is stopped.
    let guarded = factory.create_lock("g");
    let guard = guarded.lock().await.unwrap();
    fs::remove_file(store.path_for("g")).unwrap();
    let lost = tokio::time::timeout(PATIENCE, guard.lost())
        .await
        .expect("told");
    assert_eq!(lost.reason, LostReason::Replaced);
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);
}

#[tokio::test]
async fn a_long_held_lock_is_told_of_its_replacement_by_inotify_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    let factory = LockFactory::new(store.clone());
    let (unlinked, renamed) = (factory.create_lock("u"), factory.create_lock("m"));
    let mut watchers = Vec::new();
    for lock in [&unlinked, &renamed] {
        assert!(lock.try_acquire().await.unwrap());
        let watcher = store
            .watch_loss(lock.key())
            .await
            .unwrap()
            .expect("flock observes loss");
        watchers.push(tokio::spawn(watcher));
    }
    tokio::time::sleep(PAST_EARLY).await;
    // Name events for other files, and others opening and closing these, say nothing.
    let x = factory.create_lock("x");
    assert!(x.try_acquire().await.unwrap());
    fs::remove_file(store.path_for("x")).unwrap();
    assert!(!factory.create_lock("u").try_acquire().await.unwrap());
    assert!(!flock_1_gets(&store.path_for("m"), Mode::Read));
    tokio::time::sleep(EARLY_CHECKS).await;
    assert!(
        watchers.iter().all(|w| !w.is_finished()),
        "nothing happened to the held files"
    );
    fs::remove_file(store.path_for("u")).unwrap();
    let other = tmp.path().join("other");
    fs::write(&other, b"").unwrap();
    fs::rename(&other, store.path_for("m")).unwrap();
    for (watcher, how) in watchers.into_iter().zip(["unlinked", "renamed over"]) {
        let reason = tokio::time::timeout(PATIENCE, watcher)
            .await
            .unwrap_or_else(|_| panic!("{how}: an inotify name event tells the watcher"))
            .unwrap();
        assert_eq!(reason, LostReason::Replaced, "{how}");
    }
    assert_eq!(unlinked.release().await.unwrap(), Release::Lost);
    assert_eq!(renamed.release().await.unwrap(), Release::Lost);
}

#[tokio::test]
async fn a_re_acquire_after_the_file_was_replaced_locks_the_new_file() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    let lock = LockFactory::new(store.clone()).create_lock("r");
    assert!(lock.try_acquire().await.unwrap());
    let path = store.path_for("r");
    fs::remove_file(&path).unwrap();
    assert!(
        flock_1_gets(&path, Mode::Write),
        "nobody holds the new file yet"
    );
    assert!(lock.try_acquire().await.unwrap(), "re-acquired");
    assert!(
        !flock_1_gets(&path, Mode::Read),
        "the lock is on the file the name leads to now"
    );
    assert_eq!(
        store.exists(lock.key()).await.unwrap(),
        Holding::Held(Mode::Write)
    );
    let _ = lock.release().await.unwrap();
}

#[tokio::test]
async fn inheritable_descriptors_are_the_locked_file_and_a_release_lets_go_for_children_too() {
    use std::os::fd::AsFd as _;
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    let factory = LockFactory::new(store.clone());
    let path = store.path_for("r");
    let lock = factory.create_lock("r");
    assert!(
        store.inheritable_descriptors(lock.key()).unwrap().is_none(),
        "nothing held"
    );
    assert!(lock.try_acquire().await.unwrap());
    let mut fds = store
        .inheritable_descriptors(lock.key())
        .unwrap()
        .expect("a held flock lock has a descriptor");
    assert_eq!(fds.len(), 1);
    let fd = fds.pop().unwrap();
    let held = rustix::fs::fstat(fd.as_fd()).unwrap();
    let named = fs::metadata(&path).unwrap();
    assert_eq!(
        (held.st_dev, held.st_ino),
        (named.dev(), named.ino()),
        "the locked file"
    );
    // A child holding it (as its stdin) shares the lock; a release unlocks it for the child too
    // (the lock belongs to the open file, which both share). That a killed parent's child keeps
    // the lock is `xtr-lock run`'s test.
    let mut child = Command::new("sleep")
        .arg("30")
        .stdin(Stdio::from(fd))
        .spawn()
        .unwrap();
    assert!(!flock_1_gets(&path, Mode::Read));
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert!(
        flock_1_gets(&path, Mode::Write),
        "released for the child too"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
