//! Watching a holder's lock or slot files for a replacement: the loss watcher both locks and
//! semaphores use.

use std::sync::Arc;
use std::time::Duration;

use super::wake::Hub;
use crate::error::LostReason;
use crate::store::LossWatcher;

/// How often a holder's file is checked for a replacement where inotify cannot tell.
const LOSS_CHECK: Duration = Duration::from_secs(1);

/// For how long a new loss watcher checks the file itself, every [`EARLY_CHECK`], before it
/// asks inotify for name events. A process that exits while it has an inotify mark (or just
/// removed one) waits for the kernel to retire it: measured at 5–10 ms more for
/// `xtr-lock run -- true`, four times `flock(1)`. Short holds never make a mark this way.
const EARLY: Duration = Duration::from_secs(1);
const EARLY_CHECK: Duration = Duration::from_millis(100);

/// Completes with the reason `check` gives once it gives one: `check` is asked every 100 ms for
/// the first second, then at each inotify name event of `name` (a file name, or a semaphore's
/// channel), once a second where inotify cannot tell.
pub(super) fn watcher(
    hub: Arc<Hub>,
    name: String,
    check: impl Fn() -> Option<LostReason> + Send + 'static,
) -> LossWatcher {
    LossWatcher::new(async move {
        let started = tokio::time::Instant::now();
        while started.elapsed() < EARLY {
            if let Some(reason) = check() {
                return reason;
            }
            tokio::time::sleep(EARLY_CHECK).await;
        }
        // Subscribed before the check, so an event between the two is not missed.
        let mut changed = hub.subscribe_name(&name);
        // Known once subscribed: the first listener starts inotify.
        let every = (!hub.observes_other_processes()).then_some(LOSS_CHECK);
        loop {
            if let Some(reason) = check() {
                return reason;
            }
            match every {
                Some(every) => {
                    tokio::select! {
                        () = changed.changed() => {}
                        () = tokio::time::sleep(every) => {}
                    }
                }
                None => changed.changed().await,
            }
        }
    })
}
