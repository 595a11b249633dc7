//! One module per subcommand.

pub mod bench;
pub mod keys;
pub mod run;

use anyhow::Result;
use xtr_lock::Lock;
use xtr_lock::Lockable as _;

use crate::config::{StoreConfig, Wait};
use crate::output::StatusLine;

/// Takes `lock` as `wait` says. `Ok(false)`: held by someone else (or `--wait` ran out).
pub async fn take(lock: &Lock, store: &StoreConfig, wait: &Wait) -> Result<bool> {
    if wait.nonblock {
        return Ok(if wait.shared {
            lock.try_acquire_read().await?
        } else {
            lock.try_acquire().await?
        });
    }
    // Try once before showing anything: most locks are free.
    let got = if wait.shared {
        lock.try_acquire_read().await?
    } else {
        lock.try_acquire().await?
    };
    if got {
        return Ok(true);
    }
    let _status = StatusLine::start(store.store.clone(), lock.resource().to_owned(), wait.quiet);
    Ok(match (wait.wait, wait.shared) {
        (Some(d), false) => lock.acquire_timeout(d).await?,
        (Some(d), true) => lock.acquire_read_timeout(d).await?,
        (None, false) => lock.acquire().await.map(|()| true)?,
        (None, true) => lock.acquire_read().await.map(|()| true)?,
    })
}

/// The message for a lock held by someone else.
pub fn conflict_message(lock: &Lock, wait: &Wait) -> String {
    match wait.wait {
        Some(d) => format!(
            "xtr-lock: {:?} is still held by someone else after {}",
            lock.resource(),
            crate::output::short(d)
        ),
        None => format!("xtr-lock: {:?} is held by someone else", lock.resource()),
    }
}
