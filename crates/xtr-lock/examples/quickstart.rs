//! Quick start: three workers want to build the same nightly report; only one may.
//!
//! Run with `cargo run -p xtr-lock --example quickstart`. Pass a DSN as the first argument to
//! use another store (default `flock`: lock files in `<tmp>/xtr-lock-<uid>`, no server).

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, RunOptions, Wait};

#[tokio::main]
async fn main() -> xtr_lock::Result<()> {
    let dsn = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "flock".to_owned());
    let factory = LockFactory::from_dsn(&dsn)?;
    println!("store: {}", factory.store());

    // 1. Non-blocking: whoever gets the lock does the work, the others skip it.
    let mut workers = Vec::new();
    for id in 1..=3 {
        let factory = factory.clone();
        workers.push(tokio::spawn(async move {
            let lock = factory
                .create_lock("nightly-report")
                .with_ttl(Duration::from_secs(60));
            if lock.try_acquire().await? {
                println!(
                    "worker {id}: building the report (fencing token {:?})",
                    lock.fencing_token()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                if !lock.release().await?.was_held() {
                    println!("worker {id}: the lock was lost before the release");
                }
            } else {
                println!("worker {id}: someone else is building it, skipping");
            }
            Ok::<_, xtr_lock::Error>(())
        }));
    }
    for w in workers {
        w.await.expect("worker panicked")?;
    }

    // 2. Blocking: a waiter is woken the moment the holder lets go, not at the next poll.
    let holder = factory.create_lock("subscription:42");
    holder.acquire().await?;
    let started = Arc::new(Instant::now());
    let waiter = tokio::spawn({
        let factory = factory.clone();
        let started = started.clone();
        async move {
            factory
                .run(
                    "subscription:42",
                    RunOptions::new().wait(Wait::AtMost(Duration::from_secs(5))),
                    || async {
                        println!(
                            "waiter: renewing the subscription after {:?}",
                            started.elapsed()
                        );
                        Ok::<_, xtr_lock::Error>(())
                    },
                )
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = started.elapsed();
    let _ = holder.release().await?;
    waiter.await.expect("waiter panicked")?;
    println!("holder: released at {released_at:?}");
    Ok(())
}
