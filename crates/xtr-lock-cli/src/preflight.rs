//! `-v`'s pre-flight check of `run` and `acquire`: the store's warnings
//! ([`Store::check`]), asked beside the first attempt and said once, on
//! stderr, when the lock is taken or the wait begins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::task::JoinHandle;
use xtr_lock::Store;
use xtr_lock::store::{Severity, StoreWarning};

use crate::output;

/// Whether this process already said its store's warnings (a standby's later turns do not
/// repeat them).
static SAID: AtomicBool = AtomicBool::new(false);

/// The check under way, if `-v` asked for one; dropped unsaid (the lock refused), it stops.
pub(crate) struct Preflight {
    task: Option<JoinHandle<xtr_lock::Result<Vec<StoreWarning>>>>,
}

impl Preflight {
    /// Starts the check beside the first attempt when `verbose` and not yet done by this
    /// process: the lock waits for it at most until the check answers, and never more than
    /// one check.
    pub(crate) fn start(store: &Arc<dyn Store>, verbose: bool) -> Preflight {
        if !verbose || SAID.swap(true, Ordering::Relaxed) {
            return Preflight { task: None };
        }
        let store = store.clone();
        Preflight {
            task: Some(tokio::spawn(async move { store.check().await })),
        }
    }

    /// Says what the check found (once): each warning and note on a line of its own; a check
    /// that failed is a note, nothing more.
    pub(crate) async fn say(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        let found = match task.await {
            Ok(found) => found,
            Err(_) => return,
        };
        match found {
            Ok(found) => {
                for w in found {
                    match w.severity() {
                        Severity::Note => note(&w.to_string()),
                        _ => output::warning(&w.to_string()),
                    }
                }
            }
            Err(err) => note(&format!(
                "could not check the store's set-up: {}",
                output::causes(&err)
            )),
        }
    }
}

impl Drop for Preflight {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// `xtr-lock: note: …`, or a `note` event under `--json`.
fn note(message: &str) {
    if output::json() {
        output::event("note", serde_json::json!({"message": message}));
    } else {
        eprintln!("xtr-lock: note: {message}");
    }
}
