//! The overlap policies under contention: runs that replace, queue behind and wait for each
//! other on one resource never overlap, and revocations and queueing really happen.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use xtr_lock::{ErrorKind, InMemoryStore, LockFactory, LostReason, OnConflict, RunOptions, Wait};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis;

/// What the contenders saw.
#[derive(Default)]
struct Tally {
    inside: AtomicUsize,
    sections: AtomicUsize,
    revoked: AtomicUsize,
    skipped: AtomicUsize,
}

/// Leaves the section when the body ends or is dropped (a revoked body is dropped).
struct Inside(Arc<Tally>);

impl Inside {
    fn enter(tally: &Arc<Tally>) -> Inside {
        let before = tally.inside.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two bodies ran at once");
        tally.sections.fetch_add(1, Ordering::SeqCst);
        Inside(tally.clone())
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Six contenders run 30 ms bodies on one resource for `period`: one replaces whoever holds,
/// two queue one run at most, two wait and one skips. (Two replacing at once take turns revoking
/// each other, as two `run-this-one` do.)
async fn contend(factory: LockFactory, period: Duration) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let policies = [
        OnConflict::Replace,
        OnConflict::QueueOne,
        OnConflict::Wait,
        OnConflict::Skip,
        OnConflict::QueueOne,
        OnConflict::Wait,
    ];
    let resource = format!("jobs-contention:{}", rand::random::<u32>());
    let until = Instant::now() + period;
    let mut tasks = Vec::new();
    for policy in policies {
        let (factory, tally, resource) = (factory.clone(), tally.clone(), resource.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let options = RunOptions::new()
                    .ttl(Duration::from_secs(3))
                    .wait(Wait::AtMost(Duration::from_secs(5)))
                    .on_conflict(policy);
                let body_tally = tally.clone();
                let ran = factory
                    .run(&resource, options, || async move {
                        let _inside = Inside::enter(&body_tally);
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        Ok::<(), xtr_lock::Error>(())
                    })
                    .await;
                match ran {
                    Ok(()) => {}
                    Err(err) if err.lost_reason() == Some(LostReason::Revoked) => {
                        tally.revoked.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(err) if err.kind() == ErrorKind::Conflict => {
                        tally.skipped.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(err) => panic!("{policy:?}: {err}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    tally
}

fn check(tally: &Tally) {
    let (sections, revoked, skipped) = (
        tally.sections.load(Ordering::SeqCst),
        tally.revoked.load(Ordering::SeqCst),
        tally.skipped.load(Ordering::SeqCst),
    );
    eprintln!("{sections} sections, {revoked} revoked, {skipped} skipped");
    assert!(sections >= 20, "{sections} sections");
    assert!(
        sections - revoked >= 5,
        "runs completed: {}",
        sections - revoked
    );
    assert!(revoked >= 1, "replacing runs revoked others: {revoked}");
    assert!(
        skipped >= 1,
        "skipping and queue-one runs gave up: {skipped}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_never_overlap_in_memory() {
    let tally = contend(
        LockFactory::new(InMemoryStore::new()),
        Duration::from_secs(3),
    )
    .await;
    check(&tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_never_overlap_on_redis() {
    let server = RedisServer::start();
    let factory = LockFactory::new(on_redis::store(&server));
    let tally = contend(factory, Duration::from_secs(4)).await;
    check(&tally);
}
