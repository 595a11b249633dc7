//! The SysV store's counting semaphores: limits and weights counted by the kernel, a killed
//! holder process's permits back at once (`SEM_UNDO`), the stored limit, waking, dropped waits,
//! `ipcrm`. Every test uses its own names and removes its set at the end.

use std::process::{Command, Stdio};
use std::time::Duration;

use rand::Rng as _;
use xtr_lock::store::counting_semaphore_key;
use xtr_lock::{ErrorKind, LockFactory, Lockable as _, Release, Semaphore, SemaphoreStore};

use crate::support::{holder_process, root};

/// A semaphore name no other test (or earlier run) uses; its set is removed when dropped.
struct Name(String);

impl Name {
    fn new(what: &str) -> Name {
        Name(format!(
            "sysv-count:{what}:{}:{}",
            std::process::id(),
            rand::rng().random::<u64>()
        ))
    }

    fn ipcrm(&self) -> bool {
        let key = format!("{:#x}", counting_semaphore_key(&self.0) as u32);
        Command::new("ipcrm")
            .args(["-S", &key])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    }
}

impl Drop for Name {
    fn drop(&mut self) {
        self.ipcrm();
    }
}

fn sem(name: &Name, limit: u32, count: u32) -> Semaphore {
    LockFactory::new(SemaphoreStore::new())
        .create_semaphore(&name.0, limit)
        .unwrap()
        .permits(count)
        .unwrap()
}

#[tokio::test]
async fn sysv_counting_weights_add_up_to_the_limit_and_the_lock_of_that_name_is_apart() {
    let name = Name::new("weights");
    let two = sem(&name, 3, 2);
    assert!(two.try_acquire().await.unwrap());
    let other_two = sem(&name, 3, 2);
    assert!(!other_two.try_acquire().await.unwrap(), "2 + 2 > 3");
    let one = sem(&name, 3, 1);
    assert!(one.try_acquire().await.unwrap());
    assert!(one.try_acquire().await.unwrap(), "its holder still holds");
    assert!(!sem(&name, 3, 1).try_acquire().await.unwrap());
    let usage = one.usage().await.unwrap();
    assert_eq!((usage.used, usage.limit), (3, Some(3)));
    assert_eq!(two.release().await.unwrap(), Release::Released);
    assert!(other_two.try_acquire().await.unwrap());
    assert_eq!(one.release().await.unwrap(), Release::Released);
    assert_eq!(one.remaining().await.unwrap(), 1);
    let lock = LockFactory::new(SemaphoreStore::new()).create_lock(&name.0);
    assert!(lock.try_acquire().await.unwrap(), "a lock is another set");
    let _ = lock.release().await.unwrap();
}

#[tokio::test]
async fn sysv_counting_limit_binds_while_held_and_changes_once_nobody_holds() {
    let name = Name::new("limit");
    let held = sem(&name, 3, 1);
    assert!(held.try_acquire().await.unwrap());
    for wait in [false, true] {
        let other = sem(&name, 4, 1);
        let err = if wait {
            other
                .acquire_timeout(Duration::from_secs(5))
                .await
                .unwrap_err()
        } else {
            other.try_acquire().await.unwrap_err()
        };
        let err = root(&err);
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("limit of 3") && text.contains("limit of 4"),
            "{text}"
        );
    }
    drop(held); // the permit goes back with the key
    let four = sem(&name, 4, 4);
    assert!(four.try_acquire().await.unwrap(), "nobody holds: 4 now");
    assert_eq!(four.usage().await.unwrap().limit, Some(4));
    assert!(!sem(&name, 4, 1).try_acquire().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysv_counting_a_release_wakes_a_waiter_and_dropped_waits_leave_nothing() {
    let name = Name::new("wake");
    let a = sem(&name, 2, 1);
    assert!(a.try_acquire().await.unwrap());
    for _ in 0..5 {
        let dropped = sem(&name, 2, 2);
        let _ = tokio::time::timeout(Duration::from_millis(20), dropped.acquire()).await;
    }
    let both = sem(&name, 2, 2);
    let waiter = tokio::spawn(async move {
        let got = both.acquire_timeout(Duration::from_secs(20)).await.unwrap();
        (got, both)
    });
    assert_eq!(a.release().await.unwrap(), Release::Released);
    let (got, both) = waiter.await.unwrap();
    assert!(got);
    assert_eq!(both.usage().await.unwrap().used, 2);
    let _ = both.release().await.unwrap();
    assert_eq!(
        sem(&name, 2, 1).usage().await.unwrap().used,
        0,
        "the dropped waits hold nothing"
    );
}

#[tokio::test]
async fn sysv_counting_a_set_removed_by_ipcrm_is_lost() {
    let name = Name::new("ipcrm");
    let s = sem(&name, 2, 1);
    assert!(s.try_acquire().await.unwrap());
    assert!(name.ipcrm());
    assert!(!s.is_acquired().await.unwrap());
    assert_eq!(s.release().await.unwrap(), Release::Lost);
    assert!(sem(&name, 2, 2).try_acquire().await.unwrap(), "a new set");
}

/// The holder process of the next test: this test binary run again with `XTR_SYSV_HOLD` set,
/// taking 2 of 2 permits, saying so, and sleeping until killed.
#[tokio::test]
#[ignore = "the holder process of sysv_counting_a_killed_holder_process_gives_its_permits_back_at_once"]
async fn sysv_counting_holder_process() {
    let resource = std::env::var("XTR_SYSV_HOLD").expect("run by the test that kills it");
    let s = LockFactory::new(SemaphoreStore::new())
        .create_semaphore(resource, 2)
        .unwrap()
        .permits(2)
        .unwrap();
    assert!(s.try_acquire().await.unwrap());
    println!("held");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[tokio::test]
async fn sysv_counting_a_killed_holder_process_gives_its_permits_back_at_once() {
    let name = Name::new("kill");
    let mut child = holder_process::start(
        "sysv_semaphore::sysv_counting_holder_process",
        "XTR_SYSV_HOLD",
        &name.0,
    );
    let mine = sem(&name, 2, 1);
    assert!(!mine.try_acquire().await.unwrap(), "it holds both");
    assert_eq!(mine.usage().await.unwrap().used, 2);
    child.kill().unwrap(); // SIGKILL: no clean-up of its own
    child.wait().unwrap();
    let both = sem(&name, 2, 2);
    assert!(
        both.try_acquire().await.unwrap(),
        "the kernel undid the dead holder's permits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sysv_counting_first_users_racing_make_one_set_of_the_limit() {
    let name = std::sync::Arc::new(Name::new("race"));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (name, barrier) = (name.clone(), barrier.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let s = sem(&name, 3, 1);
                    barrier.wait();
                    let got = s.try_acquire().await.unwrap();
                    barrier.wait(); // everyone tried before anyone lets go
                    got
                })
            })
        })
        .collect();
    let got = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(|g| *g)
        .count();
    assert_eq!(got, 3);
}
