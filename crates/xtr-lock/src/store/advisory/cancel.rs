//! Cancelling a lock statement that waits in the server, from another connection.
//!
//! A cancel request (`pg_cancel_backend`, `KILL QUERY`) only stops what the session is running
//! when the request arrives. One that arrives before the server has started the lock statement
//! (it is still on the wire, or just parsed) finds the session idle and is lost, and the statement
//! would then wait for the holder. So the request is repeated, with a growing pause, for as long
//! as the statement is unanswered; only its answer says how it ended. A session that ignores every
//! request (the server is paused, the control pool cannot connect) is given up after the
//! statement timeout: closing its connection ends its wait and frees whatever it held.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::conns::Conns;

const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// The cancel requests for one lock statement.
pub(super) struct Canceller {
    conns: Arc<Conns>,
    pid: i64,
    /// The request in flight or the last one sent.
    task: Option<JoinHandle<Result<(), String>>>,
    /// When the first request went out.
    since: Option<Instant>,
    pause: Duration,
    next: Instant,
}

/// What a tick decided.
pub(super) enum Tick {
    /// Still waiting for the statement's answer.
    Waiting,
    /// No answer within the statement timeout since the first request: close the connection.
    GiveUp,
}

impl Canceller {
    pub(super) fn new(conns: Arc<Conns>, pid: i64) -> Canceller {
        Canceller {
            conns,
            pid,
            task: None,
            since: None,
            pause: FIRST_PAUSE,
            next: Instant::now(),
        }
    }

    /// Whether a cancel was asked for.
    pub(super) fn started(&self) -> bool {
        self.since.is_some()
    }

    /// Sends the first request (once; later calls do nothing).
    pub(super) fn start(&mut self) {
        if self.since.is_none() {
            let now = Instant::now();
            self.since = Some(now);
            self.send();
            self.next = now + self.pause;
        }
    }

    fn send(&mut self) {
        let conns = self.conns.clone();
        let pid = self.pid;
        self.task = Some(tokio::spawn(async move { conns.cancel(pid).await }));
    }

    /// When [`tick`](Self::tick) wants to run next (meaningful once started).
    pub(super) fn next(&self) -> Instant {
        self.next
    }

    /// The statement is still unanswered at [`next`](Self::next): send another request (when
    /// the last one has finished), or give up.
    pub(super) fn tick(&mut self) -> Tick {
        let Some(since) = self.since else {
            return Tick::Waiting;
        };
        let now = Instant::now();
        if now.duration_since(since) >= self.conns.config.statement_timeout {
            return Tick::GiveUp;
        }
        if self.task.as_ref().is_none_or(JoinHandle::is_finished) {
            self.send();
        }
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        self.next = now + self.pause;
        Tick::Waiting
    }

    /// Waits for the request in flight, so that it cannot cancel the session's next statement
    /// instead (one that still does is retried by the caller).
    pub(super) async fn finish(self) {
        if let Some(task) = self.task
            && let Ok(Err(why)) = task.await
        {
            tracing::debug!(target: crate::logging::TARGET, error = %why,
                "a cancel request for a session lock wait failed");
        }
    }
}
