//! One module per subcommand.

pub(crate) mod bench;
pub(crate) mod keys;
pub(crate) mod run;

use anyhow::Result;
use xtr_lock::{Lock, Lockable as _, Wait};

use crate::config::{StoreConfig, Take};
use crate::output::StatusLine;

/// Takes `lock` as `take` says. `Ok(false)`: held by someone else (or `--wait` ran out).
pub(crate) async fn take(lock: &Lock, store: &StoreConfig, take: &Take) -> Result<bool> {
    // Try once before showing anything: most locks are free.
    if lock.acquire_with(take.mode, Wait::Never).await? {
        return Ok(true);
    }
    if take.wait == Wait::Never || take.wait == Wait::AtMost(std::time::Duration::ZERO) {
        return Ok(false);
    }
    let _status = StatusLine::start(store.store.clone(), lock.resource().to_owned(), take.quiet);
    Ok(lock.acquire_with(take.mode, take.wait).await?)
}

/// The message for a lock held by someone else.
pub(crate) fn conflict_message(lock: &Lock, take: &Take) -> String {
    match take.wait {
        Wait::AtMost(d) if !d.is_zero() => format!(
            "xtr-lock: {:?} is still held by someone else after {}",
            lock.resource(),
            crate::output::short(d)
        ),
        _ => format!("xtr-lock: {:?} is held by someone else", lock.resource()),
    }
}
