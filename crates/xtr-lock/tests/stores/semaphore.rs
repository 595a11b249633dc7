//! The SysV semaphore store against real PHP processes on Symfony's `SemaphoreStore`
//! (`tests/peers/symfony_holder.php`), both ways, and its cancellation safety. Every test uses its own
//! resource names, so the machine's semaphores are shared safely.

use std::process::Command;
use std::time::{Duration, Instant};

use rand::Rng as _;
use xtr_lock::store::semaphore_key;
use xtr_lock::{LockFactory, Lockable as _, Release, SemaphoreStore, Store as _};

use crate::support::symfony_sql::Holder;

fn factory() -> LockFactory {
    LockFactory::new(SemaphoreStore::new())
}

/// A resource name no other test (or earlier run) uses.
fn unique(what: &str) -> String {
    format!(
        "sem-test:{what}:{}:{}",
        std::process::id(),
        rand::rng().random::<u64>()
    )
}

/// The semaphore values of `resource`'s set (lock, usage, guard) as `ipcs` shows them, or
/// `None` when there is no set.
fn set_values(resource: &str) -> Option<Vec<i64>> {
    set_column(resource, 1)
}

/// How many processes or threads are blocked waiting to take `resource`'s lock (the lock
/// semaphore's `ncount`).
fn blocked_on(resource: &str) -> i64 {
    set_column(resource, 2).map_or(0, |c| c[0])
}

/// Waits (up to 10 s) until someone is blocked in the kernel on `resource`'s lock.
async fn until_blocked(resource: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while blocked_on(resource) == 0 {
        assert!(Instant::now() < deadline, "no waiter blocked on {resource}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Column `column` of `ipcs -s -i` (semnum value ncount zcount pid) for the set's three
/// semaphores.
fn set_column(resource: &str, column: usize) -> Option<Vec<i64>> {
    let key = format!("{:#010x}", semaphore_key(resource) as u32);
    let list = Command::new("ipcs")
        .arg("-s")
        .output()
        .expect("ipcs (util-linux)");
    let list = String::from_utf8_lossy(&list.stdout);
    let id = list
        .lines()
        .find(|l| l.starts_with(&key))?
        .split_whitespace()
        .nth(1)?
        .to_owned();
    let out = Command::new("ipcs")
        .args(["-s", "-i", &id])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // Rows after the "semnum value ncount zcount pid" header.
    let values = text
        .lines()
        .skip_while(|l| !l.starts_with("semnum"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(column)?.parse().ok())
        .collect::<Vec<i64>>();
    (values.len() == 3).then_some(values)
}

#[tokio::test]
async fn the_key_is_phps() {
    for resource in ["invoice:42", "", "é ü 🔒", "a/b\\c"] {
        let out = Command::new("php")
            .args([
                "-r",
                "echo unpack('i', md5($argv[1], true))[1];",
                "--",
                resource,
            ])
            .output()
            .expect("php (the README's test command installs php-cli)");
        let php: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert_eq!(semaphore_key(resource), php, "{resource:?}");
    }
}

#[tokio::test]
async fn a_php_holder_excludes_rust_and_its_release_wakes_a_rust_waiter() {
    let resource = unique("php-holds");
    let mut php = Holder::start_on("semaphore", &resource, "write", 60.0, &["--ttl=0"]);
    let info = php.until("INFO").await;
    assert_eq!(info.get("sem_key"), semaphore_key(&resource).to_string());
    php.until("ACQUIRED").await;
    let lock = factory().create_lock(&resource);
    assert!(!lock.try_acquire().await.unwrap());
    let holders = lock.store().holders(&resource).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    let waiter = lock.clone();
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    until_blocked(&resource).await;
    assert!(!waiting.is_finished());
    php.term();
    php.until("RELEASED").await;
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("Symfony's release (the set removed) wakes the kernel wait")
        .unwrap()
        .unwrap();
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert_eq!(
        set_values(&resource),
        None,
        "the release removes the set, as Symfony's does"
    );
}

#[tokio::test]
async fn a_rust_holder_excludes_php_and_its_release_wakes_a_blocked_php_waiter() {
    let resource = unique("rust-holds");
    let lock = factory().create_lock(&resource);
    lock.acquire().await.unwrap();
    let mut busy = Holder::start_on("semaphore", &resource, "write", 0.0, &["--try", "--ttl=0"]);
    busy.until("BUSY").await;
    assert_eq!(busy.exit_code().await, 1);
    // Symfony's blocking acquire: sem_acquire in the kernel, re-opened after EIDRM.
    let mut waiter = Holder::start_on("semaphore", &resource, "write", 0.2, &["--ttl=0"]);
    waiter.until("WAITING").await;
    until_blocked(&resource).await;
    assert!(waiter.seen.iter().all(|e| e.event != "ACQUIRED"));
    let released = Instant::now();
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    waiter.until("ACQUIRED").await;
    eprintln!(
        "Symfony waiter woken {:?} after the Rust release",
        released.elapsed()
    );
    waiter.until("RELEASED").await;
    assert_eq!(waiter.exit_code().await, 0);
    // And the lock is free again for Rust.
    assert!(lock.try_acquire().await.unwrap());
    let _ = lock.release().await.unwrap();
}

#[tokio::test]
async fn a_killed_php_holder_frees_the_lock_at_once() {
    let resource = unique("php-killed");
    let mut php = Holder::start_on("semaphore", &resource, "write", 60.0, &["--ttl=0"]);
    php.until("ACQUIRED").await;
    let lock = factory().create_lock(&resource);
    assert!(!lock.try_acquire().await.unwrap());
    let waiter = lock.clone();
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    until_blocked(&resource).await;
    drop(php); // SIGKILL: the kernel undoes the holder's decrement (SEM_UNDO).
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("SEM_UNDO frees the lock when its holder dies")
        .unwrap()
        .unwrap();
    let _ = lock.release().await.unwrap();
}

#[tokio::test]
async fn tasks_of_one_process_exclude_each_other_and_a_set_removed_by_ipcrm_is_a_lost_lock() {
    let resource = unique("ipcrm");
    let a = factory().create_lock(&resource);
    let b = factory().create_lock(&resource);
    a.acquire().await.unwrap();
    assert!(!b.try_acquire().await.unwrap());
    assert_eq!(
        a.store().exists(a.key()).await.unwrap().mode(),
        Some(xtr_lock::Mode::Write)
    );
    let key = format!("{:#x}", semaphore_key(&resource) as u32);
    assert!(
        Command::new("ipcrm")
            .args(["-S", &key])
            .status()
            .unwrap()
            .success()
    );
    assert!(
        !a.is_acquired().await.unwrap(),
        "the holder sees its set gone"
    );
    assert!(b.try_acquire().await.unwrap());
    assert_eq!(a.release().await.unwrap(), Release::Lost);
    let _ = b.release().await.unwrap();
}

/// Waits and tries dropped at random points, while another holder holds and releases: nothing
/// stays held and the set's usage count comes back to the holder's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_and_tries_dropped_at_random_points_leave_nothing_held() {
    let resource = unique("cancel");
    let f = factory();
    let holder = f.create_lock(&resource);
    for round in 0..60u64 {
        holder.acquire().await.unwrap();
        let waiter = f.create_lock(&resource);
        let cut = Duration::from_micros(rand::rng().random_range(0..3000));
        let w = waiter.clone();
        let attempt = async move {
            if round % 2 == 0 {
                w.acquire().await.map(|()| true)
            } else {
                w.try_acquire().await
            }
        };
        // Half the rounds release the holder during the attempt, so some are cut after the
        // kernel granted the lock.
        let release_during = round % 3 == 0;
        let h = holder.clone();
        let releaser = tokio::spawn(async move {
            if release_during {
                tokio::time::sleep(cut / 2).await;
                let _ = h.release().await.unwrap();
            }
        });
        let _ = tokio::time::timeout(cut, attempt).await;
        releaser.await.unwrap();
        // The waiter's lock, if it got one, is released by the lock's own clean-up.
        drop(waiter);
        if !release_during {
            let values = set_values(&resource).expect("the holder's set");
            assert_eq!(values[0], 0, "round {round}: held by the holder");
            assert_eq!(
                holder.release().await.unwrap(),
                Release::Released,
                "round {round}"
            );
        }
        // Free for a new holder within a moment (a dropped wait's thread stops within 50 ms).
        let check = f.create_lock(&resource);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check.try_acquire().await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "round {round}: the lock stayed held"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A dropped wait's thread counts itself out within its 50 ms step.
        loop {
            let values = set_values(&resource).expect("the check's set");
            if values[1] == 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: a dropped attempt stayed counted in: {values:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = check.release().await.unwrap();
    }
    assert_eq!(set_values(&resource), None);
}
