//! FlockStore with other processes on the same files: `flock(1)` (cross-process exclusion,
//! crash release, waking) and the real Python xtr-lock 4.1.0 (from PyPI, in a venv the testkit
//! makes), in both directions.

#![cfg(target_os = "linux")]

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use xtr_lock::{FlockStore, LockFactory, Lockable as _, Release, Store};

use crate::support::peer::Peer;

const PATIENCE: Duration = Duration::from_secs(10);

/// A store whose safety-net poll never fires during a test: only a release can wake a waiter.
fn no_poll(dir: &Path) -> FlockStore {
    FlockStore::in_dir(dir)
        .unwrap()
        .with_poll_interval(Duration::from_secs(3600))
}

// ---- other processes: flock(1) ----------------------------------------------------------------

fn flock_cmd(args: &[&str], file: &Path) -> bool {
    Command::new("flock")
        .args(args)
        .arg(file)
        .arg("true")
        .status()
        .expect("flock(1) from util-linux")
        .success()
}

#[tokio::test]
async fn flock_1_sees_our_modes() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    let lock = LockFactory::new(store.clone()).create_lock("shell");
    let file = store.path_for("shell");
    lock.try_acquire().await.unwrap();
    assert!(
        !flock_cmd(&["-n", "-s"], &file),
        "our write lock excludes flock -s"
    );
    assert!(!flock_cmd(&["-n", "-x"], &file));
    lock.try_acquire_read().await.unwrap();
    assert!(
        flock_cmd(&["-n", "-s"], &file),
        "our read lock admits flock -s"
    );
    assert!(!flock_cmd(&["-n", "-x"], &file), "and excludes flock -x");
    let _ = lock.release().await.unwrap();
    assert!(flock_cmd(&["-n", "-x"], &file));
}

/// `flock -o -x FILE sleep 60` in its own process group: the flock process holds the lock (-o:
/// its child does not inherit the descriptor).
pub(super) struct FlockHolder(Child);

impl FlockHolder {
    fn spawn(file: &Path, mode: &str) -> FlockHolder {
        use std::os::unix::process::CommandExt as _;
        let child = Command::new("flock")
            .args(["-o", mode])
            .arg(file)
            .args(["sleep", "60"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("flock(1) from util-linux");
        FlockHolder(child)
    }

    /// flock(1) holding `resource`'s file of `store` in `mode` (`-x`, `-s`), once the kernel
    /// lists it.
    pub(super) async fn holding(store: &FlockStore, resource: &str, mode: &str) -> FlockHolder {
        let file = store.path_for(resource);
        fs::File::create(&file).unwrap();
        let child = FlockHolder::spawn(&file, mode);
        wait_until_held_by(store, resource, child.id()).await;
        child
    }

    pub(super) fn id(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL to flock and its sleep: a crash, so the kernel closes the descriptor.
    fn kill(&mut self) {
        let pgid = rustix::process::Pid::from_raw(self.0.id() as i32).expect("a child pid");
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        let _ = self.0.wait();
    }
}

impl Drop for FlockHolder {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn wait_until_held_by(store: &FlockStore, resource: &str, pid: u32) {
    let deadline = Instant::now() + PATIENCE;
    while !store
        .holders(resource)
        .await
        .unwrap()
        .iter()
        .any(|h| h.pid == Some(pid))
    {
        assert!(Instant::now() < deadline, "flock(1) never took the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_killed_holder_in_another_process_wakes_our_waiter_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = no_poll(tmp.path());
    let mut child = FlockHolder::holding(&store, "crash", "-x").await;
    let factory = LockFactory::new(store.clone());
    let lock = factory.create_lock("crash");
    assert!(
        !lock.try_acquire().await.unwrap(),
        "held by another process"
    );
    assert!(!lock.try_acquire_read().await.unwrap());
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());
    child.kill();
    tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("woken by the close, with no poll to fall back on")
        .unwrap()
        .unwrap();
    assert_eq!(
        store.holders("crash").await.unwrap()[0].pid,
        Some(std::process::id())
    );
}

#[tokio::test]
async fn a_reader_in_another_process_admits_our_readers_and_excludes_our_writers() {
    let tmp = tempfile::tempdir().unwrap();
    let store = no_poll(tmp.path());
    let mut child = FlockHolder::holding(&store, "shared", "-s").await;
    let factory = LockFactory::new(store.clone());
    let reader = factory.create_lock("shared");
    assert!(reader.try_acquire_read().await.unwrap());
    let writer = factory.create_lock("shared");
    assert!(!writer.try_acquire().await.unwrap());
    let _ = reader.release().await.unwrap();
    let wait = tokio::spawn({
        let writer = writer.clone();
        async move { writer.acquire().await }
    });
    child.kill();
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

// ---- Python xtr-lock 4.1.0 --------------------------------------------------------------------

#[tokio::test]
async fn python_and_rust_name_the_same_files() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FlockStore::in_dir(tmp.path()).unwrap();
    let mut py = Peer::python("flock", tmp.path().to_str().unwrap());
    for resource in [
        "reports:nightly",
        "",
        "..",
        "a/b/../c",
        "héllo wörld",
        &"é".repeat(200),
    ] {
        let theirs = py.call("file_for", resource);
        assert_eq!(
            theirs,
            store.path_for(resource).to_str().unwrap(),
            "{resource:?}"
        );
    }
}

#[tokio::test]
async fn python_holds_and_rust_waits_woken_by_the_release() {
    let tmp = tempfile::tempdir().unwrap();
    let store = no_poll(tmp.path());
    let factory = LockFactory::new(store.clone());
    let mut py = Peer::python("flock", tmp.path().to_str().unwrap());
    assert_eq!(py.call("try_write", "invoice:42"), true);
    let lock = factory.create_lock("invoice:42");
    assert!(!lock.try_acquire().await.unwrap());
    assert!(!lock.try_acquire_read().await.unwrap());
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());
    py.call("release", "invoice:42");
    tokio::time::timeout(PATIENCE, waiter)
        .await
        .expect("woken by Python's release, with no poll to fall back on")
        .unwrap()
        .unwrap();
    assert_eq!(
        py.call("try_write", "invoice:42"),
        false,
        "and now Python is excluded"
    );
    assert_eq!(py.call("try_read", "invoice:42"), false);
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert_eq!(py.call("try_write", "invoice:42"), true);
}

#[tokio::test]
async fn readers_in_both_languages_share_and_exclude_writers() {
    let tmp = tempfile::tempdir().unwrap();
    let factory = LockFactory::new(FlockStore::in_dir(tmp.path()).unwrap());
    let mut py = Peer::python("flock", tmp.path().to_str().unwrap());
    let ours = factory.create_lock("report");
    assert!(ours.try_acquire_read().await.unwrap());
    assert_eq!(
        py.call("try_read", "report"),
        true,
        "readers share across languages"
    );
    let writer = factory.create_lock("report");
    assert!(
        !writer.try_acquire().await.unwrap(),
        "a Python reader excludes our writer"
    );
    assert!(!ours.try_acquire().await.unwrap(), "and our promotion");
    assert!(
        ours.is_acquired().await.unwrap(),
        "which keeps our read lock"
    );
    py.call("release", "report");
    assert!(
        ours.try_acquire().await.unwrap(),
        "sole reader now: promotes"
    );
    assert_eq!(
        py.call("try_read", "report"),
        false,
        "our writer excludes Python readers"
    );
    let _ = ours.release().await.unwrap();
}

#[tokio::test]
async fn python_waits_for_rust() {
    let tmp = tempfile::tempdir().unwrap();
    let factory = LockFactory::new(FlockStore::in_dir(tmp.path()).unwrap());
    let mut py = Peer::python("flock", tmp.path().to_str().unwrap());
    let lock = factory.create_lock("cron");
    lock.acquire().await.unwrap();
    py.send("wait_write", "cron", None);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = lock.release().await.unwrap();
    let answer = py.read();
    assert_eq!(answer["ok"], true, "{answer}");
    assert_eq!(
        answer["result"], true,
        "Python got the lock after our release"
    );
    assert!(!lock.try_acquire().await.unwrap());
}

#[tokio::test]
async fn dsns_build_flock_stores() {
    let tmp = tempfile::tempdir().unwrap();
    let dsn = format!("flock://{}", tmp.path().display());
    let store = xtr_lock::StoreFactory::create_store(&dsn).unwrap();
    assert_eq!(store.to_string(), dsn);
    let factory = LockFactory::from_arc(store);
    assert!(factory.create_lock("dsn").try_acquire().await.unwrap());
    assert!(
        FlockStore::in_dir(tmp.path())
            .unwrap()
            .path_for("dsn")
            .exists()
    );
    let default = xtr_lock::StoreFactory::create_store("flock").unwrap();
    assert_eq!(
        default.to_string(),
        format!("flock://{}", FlockStore::new().unwrap().dir().display())
    );
    assert!(!default.capabilities().serializable_keys);
}
