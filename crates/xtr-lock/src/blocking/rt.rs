//! The private runtime behind the blocking API: a current-thread tokio runtime driven by one
//! background thread, on which every store connection, renewal and background release lives.
//! Callers block on their futures with the runtime's handle (the background thread drives the
//! I/O and timers), so a future may borrow from the caller.

use std::future::Future;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::logging::TARGET;
use crate::mutex::lock;

/// How long a runtime that is shutting down waits for background releases still running.
const SETTLE: Duration = Duration::from_secs(5);

pub(super) struct Rt {
    handle: Handle,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Rt {
    pub(super) fn start() -> Result<Rt> {
        outside_runtime()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("xtr-lock-blocking")
            .build()
            .map_err(|e| Error::storage(format!("cannot start the blocking API's runtime: {e}")))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("xtr-lock-blocking".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                    // Releases scheduled by dropped guards and futures finish first.
                    crate::serial::settle(SETTLE).await;
                });
            })
            .map_err(|e| Error::storage(format!("cannot start the blocking API's thread: {e}")))?;
        Ok(Rt {
            handle,
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Runs `fut` to completion on this runtime, blocking the calling thread.
    ///
    /// # Errors
    ///
    /// [`Unsupported`](crate::ErrorKind::Unsupported) when called from inside a tokio runtime,
    /// where blocking would stall (and could deadlock) it.
    pub(super) fn run<F: Future>(&self, fut: F) -> Result<F::Output> {
        outside_runtime()?;
        Ok(self.handle.block_on(fut))
    }

    /// Runs `f` with this runtime as the current one (for what spawns: renewals, clean-ups).
    pub(super) fn enter<T>(&self, f: impl FnOnce() -> T) -> T {
        let _entered = self.handle.enter();
        f()
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(stop) = lock(&self.stop).take() {
            let _ = stop.send(());
        }
        let thread = lock(&self.thread).take();
        // Waiting inside an async context would block it: the thread then finishes alone.
        if let Some(thread) = thread
            && Handle::try_current().is_err()
            && thread.join().is_err()
        {
            tracing::warn!(target: TARGET, "the blocking API's runtime thread panicked");
        }
    }
}

/// Refuses to block inside a tokio runtime.
pub(super) fn outside_runtime() -> Result<()> {
    if Handle::try_current().is_ok() {
        return Err(Error::unsupported(
            "the blocking API was called inside a tokio runtime, where waiting would block the \
             runtime's thread (and could deadlock it): use the async API there (xtr_lock::Lock), \
             or call it from a thread of your own",
        ));
    }
    Ok(())
}
