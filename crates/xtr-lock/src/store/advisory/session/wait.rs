//! A holder's lock statements that wait in the server: the wait itself, watched for a caller
//! that goes away, a release or the handle going (each cancels it), with the holder's other
//! commands answered meanwhile; and what an ended statement left the session holding.

use std::time::Instant;

use tokio::sync::oneshot;

use super::super::cancel::{Canceller, Tick};
use super::super::db::{Failure, Op};
use super::super::outcome::{Ran, classify};
use super::{Actor, Cmd};
use crate::error::{LostReason, Result};
use crate::key::Mode;
use crate::store::sql::errors::said;
use crate::store::{Acquired, Conflict, Holding, Saved};

impl Actor {
    /// A lock statement that waits in the server, watched: a caller that goes away, a release
    /// of the same holder, or the holder's handle going cancel it; other commands are answered
    /// from what the session holds, or wait in line.
    pub(super) async fn wait(&mut self, op: Op, reply: &mut oneshot::Sender<Result<Saved>>) -> Ran {
        let sent = Instant::now();
        match self.wait_statement(op, reply).await {
            Ok(result) => {
                self.confirm(sent, &result);
                classify(result)
            }
            Err(ran) => ran,
        }
    }

    /// The statement of [`wait`](Actor::wait): its result, or how it ended without one.
    async fn wait_statement(
        &mut self,
        op: Op,
        reply: &mut oneshot::Sender<Result<Saved>>,
    ) -> std::result::Result<std::result::Result<Option<bool>, sqlx::Error>, Ran> {
        let conns = self.conns.clone();
        let held = self.holds();
        let Actor {
            id,
            conn,
            rx,
            deferred,
            shutting_down,
            ..
        } = self;
        let Some(conn) = conn.as_mut() else {
            return Err(Ran::Broken("no connection".into()));
        };
        let mut cancel = Canceller::new(conns.clone(), conn.pid);
        let statement = conn.db.op(op, id);
        tokio::pin!(statement);
        let mut reading = true;
        let result = loop {
            // Biased: the statement is polled (so sent) before anything can cancel it.
            tokio::select! {
                biased;
                result = &mut statement => break result,
                () = reply.closed(), if !cancel.started() => cancel.start(),
                cmd = rx.recv(), if reading => match cmd {
                    None => {
                        *shutting_down = true;
                        reading = false;
                        cancel.start();
                    }
                    // A wait being cancelled (its caller left) may still be granted before
                    // the cancel lands: a check then waits for the end (and no longer: it goes
                    // before a sibling's deferred wait), so that the lock's reconcile after a
                    // dropped wait sees what the wait left.
                    Some(cmd @ Cmd::Check { .. }) if cancel.started() => deferred.push_front(cmd),
                    Some(Cmd::Check { reply }) => {
                        let _ = reply.send(Ok(match held {
                            Some(mode) => Holding::Held(mode),
                            None => Holding::NotHeld(LostReason::Removed),
                        }));
                    }
                    Some(Cmd::Save { mode, wait: false, reply }) => {
                        let _ = reply.send(Ok(if held == Some(mode) {
                            Saved::Acquired(Acquired::new())
                        } else {
                            Saved::Conflict(Conflict::new().with_kept(held))
                        }));
                    }
                    Some(cmd @ Cmd::Save { .. }) => deferred.push_back(cmd),
                    Some(cmd @ Cmd::Release { .. }) => {
                        // The holder lets go: the wait ends first, then the release runs.
                        deferred.push_front(cmd);
                        reading = false;
                        cancel.start();
                    }
                },
                () = tokio::time::sleep_until(cancel.next()), if cancel.started() => {
                    if let Tick::GiveUp = cancel.tick() {
                        return Err(Ran::Broken("a cancelled lock wait did not end".into()));
                    }
                }
            }
        };
        cancel.finish().await;
        Ok(result)
    }

    /// A lock statement that ended in an error may still have taken the lock: PostgreSQL grants
    /// a waiting session its lock and only then notices a cancel request (or a deadlock check
    /// that came too late), and a session-level lock outlives the error. The session is asked
    /// what it holds; a hold it has is a grant. A session that cannot say is closed.
    pub(super) async fn recheck_grant(&mut self, ran: Ran, mode: Mode) -> Ran {
        if !matches!(ran, Ran::Cancelled | Ran::Deadlock | Ran::Refusal(_)) {
            return ran;
        }
        let timeout = self.conns.config.statement_timeout;
        // Twice: a cancel request meant for the wait may still land on the first check.
        for _ in 0..2 {
            let Some(conn) = self.conn.as_mut() else {
                return Ran::Broken("no connection".into());
            };
            match tokio::time::timeout(timeout, conn.db.check(&self.id)).await {
                Ok(Ok((write, read))) => {
                    let has = match mode {
                        Mode::Write => write,
                        Mode::Read => read,
                    };
                    return if has { Ran::Granted } else { ran };
                }
                Ok(Err(e)) if matches!(super::super::db::classify(&e), Failure::Cancelled) => {
                    continue;
                }
                Ok(Err(e)) => {
                    return Ran::Broken(format!(
                        "cannot tell what the session holds: {}",
                        said(&e)
                    ));
                }
                Err(_) => {
                    return Ran::Broken(format!(
                        "no answer within the statement timeout ({} s)",
                        timeout.as_secs_f64()
                    ));
                }
            }
        }
        Ran::Broken("cannot tell what the session holds: the checks were cancelled".into())
    }
}
