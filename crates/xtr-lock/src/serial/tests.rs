use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use super::*;

fn log() -> Arc<StdMutex<Vec<&'static str>>> {
    Arc::new(StdMutex::new(Vec::new()))
}

fn push(log: &Arc<StdMutex<Vec<&'static str>>>, what: &'static str) {
    log.lock().unwrap().push(what);
}

#[tokio::test]
async fn calls_run_one_at_a_time_in_the_order_they_were_made() {
    let serial = Serial::default();
    let seen = log();
    let (a_seen, b_seen) = (seen.clone(), seen.clone());
    let a = run(&serial, Start::IfAwaited, move |_| async move {
        push(&a_seen, "a begins");
        tokio::time::sleep(Duration::from_millis(50)).await;
        push(&a_seen, "a ends");
    });
    let b = run(&serial, Start::IfAwaited, move |_| async move {
        push(&b_seen, "b");
    });
    // Polled in the other order: b still waits for a, whose place was taken first.
    let b = tokio::spawn(b);
    tokio::task::yield_now().await;
    a.await;
    b.await.unwrap();
    assert_eq!(*seen.lock().unwrap(), ["a begins", "a ends", "b"]);
    assert_eq!(serial.started(), 2);
}

#[tokio::test]
async fn a_dropped_call_finishes_before_the_next_one_and_knows_its_caller_left() {
    let serial = Serial::default();
    let seen = log();
    let a_seen = seen.clone();
    let a = run(&serial, Start::IfAwaited, move |call| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        push(&a_seen, if call.left() { "a left" } else { "a awaited" });
    });
    let stopped = tokio::time::timeout(Duration::from_millis(5), a).await;
    assert!(stopped.is_err(), "the caller stopped waiting");
    let b_seen = seen.clone();
    run(&serial, Start::IfAwaited, move |_| async move {
        push(&b_seen, "b")
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), ["a left", "b"]);
    assert!(settle(Duration::from_secs(1)).await);
}

#[tokio::test]
async fn a_call_dropped_before_its_turn_runs_only_when_it_must() {
    let serial = Serial::default();
    let seen = log();
    let first = run(&serial, Start::IfAwaited, |_| async {
        tokio::time::sleep(Duration::from_millis(30)).await;
    });
    let first = tokio::spawn(first);
    tokio::task::yield_now().await;
    let (s1, s2) = (seen.clone(), seen.clone());
    drop(run(&serial, Start::IfAwaited, move |_| async move {
        push(&s1, "try")
    }));
    drop(run(&serial, Start::Always, move |_| async move {
        push(&s2, "release")
    }));
    let s3 = seen.clone();
    run(&serial, Start::IfAwaited, move |_| async move {
        push(&s3, "next")
    })
    .await;
    first.await.unwrap();
    assert_eq!(*seen.lock().unwrap(), ["release", "next"]);
}

#[tokio::test]
async fn a_request_given_up_on_lands_before_the_next_call() {
    let serial = Serial::default();
    let seen = log();
    let s1 = seen.clone();
    let got = run(&serial, Start::IfAwaited, move |_| async move {
        within(Duration::from_millis(20), async move {
            // Lands after the limit, well within the landing bound.
            tokio::time::sleep(Duration::from_millis(30)).await;
            push(&s1, "landed");
        })
        .await
    })
    .await;
    assert!(got.is_none(), "the caller's wait ended at the limit");
    let s2 = seen.clone();
    run(&serial, Start::IfAwaited, move |_| async move {
        push(&s2, "next")
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), ["landed", "next"]);
}

#[tokio::test]
async fn remainders_queued_by_remainders_still_go_first() {
    let serial = Serial::default();
    let seen = log();
    let s1 = seen.clone();
    run(&serial, Start::IfAwaited, move |_| async move {
        let s2 = s1.clone();
        finish_later(async move {
            push(&s2, "first");
            let s3 = s2.clone();
            finish_later(async move { push(&s3, "second") });
        });
    })
    .await;
    let s4 = seen.clone();
    run(&serial, Start::IfAwaited, move |_| async move {
        push(&s4, "next")
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), ["first", "second", "next"]);
}

#[test]
fn a_call_dropped_outside_any_runtime_still_finishes() {
    let serial = Serial::default();
    let seen = log();
    let s1 = seen.clone();
    drop(run(&serial, Start::Always, move |_| async move {
        push(&s1, "ran")
    }));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { assert!(settle(Duration::from_secs(5)).await) });
    assert_eq!(*seen.lock().unwrap(), ["ran"]);
}

#[tokio::test]
async fn a_call_that_must_run_knows_its_caller_left_before_it_began() {
    let serial = Serial::default();
    let seen = log();
    let first = tokio::spawn(run(&serial, Start::IfAwaited, |_| async {
        tokio::time::sleep(Duration::from_millis(30)).await;
    }));
    tokio::task::yield_now().await;
    let s1 = seen.clone();
    drop(run(&serial, Start::Always, move |call| async move {
        push(&s1, if call.left() { "left" } else { "awaited" });
    }));
    let s2 = seen.clone();
    run(&serial, Start::IfAwaited, move |call| async move {
        push(
            &s2,
            if call.left() {
                "next left"
            } else {
                "next awaited"
            },
        );
    })
    .await;
    first.await.unwrap();
    assert_eq!(*seen.lock().unwrap(), ["left", "next awaited"]);
}

#[tokio::test(flavor = "current_thread")]
async fn calls_that_complete_at_once_still_let_other_tasks_run() {
    let serial = Arc::new(Serial::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let looping = {
        let (serial, stop) = (serial.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                run(&serial, Start::IfAwaited, |_| async {}).await;
            }
        })
    };
    // On one thread, this timer fires only if the loop yields.
    tokio::time::sleep(Duration::from_millis(20)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(5), looping)
        .await
        .expect("the loop yields")
        .unwrap();
}
