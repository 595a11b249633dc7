//! One holder's session: a task that owns the holder's connection while it holds, runs its
//! statements in order, and is the only one that ever touches that connection.
//!
//! Callers send commands and await the answer; a caller that goes away (a dropped acquire)
//! only drops its end of the answer. The task then finishes what it started: a lock statement
//! in flight is answered (a server-side wait is cancelled first), a lock it granted is unlocked
//! again, and only a connection whose unlocks all answered goes back to the idle list. A
//! connection in any doubt is closed: the end of the session frees all it held.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::conns::{Conn, Conns};
use super::db::{LockId, Op};
use super::outcome::{Ran, classify, connect_error, is_broken};
use crate::error::{Error, LostReason, Result};
use crate::key::Mode;
use crate::store::sql::errors::said;
use crate::store::tasks::Task;
use crate::store::{Acquired, Conflict, Holding, Saved};

mod wait;

pub(super) enum Cmd {
    Save {
        mode: Mode,
        wait: bool,
        reply: oneshot::Sender<Result<Saved>>,
    },
    Check {
        reply: oneshot::Sender<Result<Holding>>,
    },
    Release {
        reply: oneshot::Sender<Result<bool>>,
    },
}

/// What the session holds, for loss watchers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Life {
    pub(super) held: Option<Mode>,
    /// Why the last hold ended without a release.
    pub(super) lost: Option<LostReason>,
    /// Counts the holds that ended (released or lost).
    pub(super) ended: u64,
    /// The session's id on the server (backend pid, connection id), while it has one.
    pub(super) pid: Option<i64>,
    /// While held, until when the lock certainly lasts if the holder goes silent now: the last
    /// round trip the server answered, plus how long the server keeps a silent client's session
    /// (less a margin). Updated without waking anyone.
    pub(super) lease_end: LeaseEnd,
}

/// When a held lock's lease ends if its holder goes silent now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum LeaseEnd {
    /// Nothing held, or nothing the server confirmed: no lease to count on.
    #[default]
    Unconfirmed,
    /// The server never ends a silent client's session on its own.
    Never,
    /// Then.
    At(Instant),
}

/// Taken off the server's time to end a silent client's session: its timers are coarse.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

impl crate::store::tasks::Life for Life {
    fn held(&self) -> Option<Mode> {
        self.held
    }
    fn ended(&self) -> u64 {
        self.ended
    }
    fn lost(&self) -> Option<LostReason> {
        self.lost
    }
}

/// The caller's end of a session.
pub(super) type Session = Task<Cmd, Life>;

/// Starts the session task of one holder of `id` (what `resource` locks).
pub(super) fn start(conns: Arc<Conns>, id: LockId, resource: String, store: Arc<str>) -> Session {
    let (tx, rx) = mpsc::unbounded_channel();
    let (life_tx, life) = watch::channel(Life::default());
    let actor = Actor {
        conns,
        id,
        resource,
        store,
        conn: None,
        write: false,
        read: false,
        lost: None,
        ended: 0,
        confirmed: None,
        life: life_tx,
        rx,
        deferred: VecDeque::new(),
        shutting_down: false,
    };
    tokio::spawn(actor.run());
    Session { tx, life }
}

struct Actor {
    conns: Arc<Conns>,
    id: LockId,
    resource: String,
    store: Arc<str>,
    conn: Option<Conn>,
    write: bool,
    read: bool,
    lost: Option<LostReason>,
    ended: u64,
    /// When the last request the server answered on the connection was sent.
    confirmed: Option<Instant>,
    life: watch::Sender<Life>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    /// Commands that came during a wait and must run after it.
    deferred: VecDeque<Cmd>,
    /// The holder's handle went: finish, unlock, and stop.
    shutting_down: bool,
}

impl Actor {
    async fn run(mut self) {
        loop {
            if self.shutting_down {
                break;
            }
            let cmd = if let Some(cmd) = self.deferred.pop_front() {
                cmd
            } else if self.holds().is_some() {
                // At least three pings within the time the server lets a silent client live.
                let silence = self.conn.as_ref().and_then(|c| c.silence);
                let ping_every = silence
                    .map_or(self.conns.config.keepalive, |s| {
                        self.conns.config.keepalive.min(s / 3)
                    })
                    .max(Duration::from_millis(50));
                tokio::select! {
                    cmd = self.rx.recv() => match cmd {
                        Some(cmd) => cmd,
                        None => break,
                    },
                    () = tokio::time::sleep(ping_every) => {
                        self.ping().await;
                        continue;
                    }
                }
            } else {
                match self.rx.recv().await {
                    Some(cmd) => cmd,
                    None => break,
                }
            };
            match cmd {
                Cmd::Save { mode, wait, reply } => self.save(mode, wait, reply).await,
                Cmd::Check { reply } => {
                    let answer = self.check().await;
                    let _ = reply.send(answer);
                }
                Cmd::Release { reply } => {
                    let answer = self.release().await;
                    let _ = reply.send(answer);
                }
            }
        }
        // The holder's handle went (its key was dropped): let go of everything.
        let _ = self.release().await;
    }

    fn holds(&self) -> Option<Mode> {
        if self.write {
            Some(Mode::Write)
        } else if self.read {
            Some(Mode::Read)
        } else {
            None
        }
    }

    fn publish(&self) {
        let life = Life {
            held: self.holds(),
            lost: self.lost,
            ended: self.ended,
            pid: self.conn.as_ref().map(|c| c.pid),
            lease_end: self.lease_end(),
        };
        self.life.send_if_modified(|l| {
            let changed = Life {
                lease_end: LeaseEnd::Unconfirmed,
                ..*l
            } != Life {
                lease_end: LeaseEnd::Unconfirmed,
                ..life
            };
            *l = life;
            changed
        });
    }

    fn lease_end(&self) -> LeaseEnd {
        let (Some(_), Some(conn), Some(confirmed)) = (self.holds(), &self.conn, self.confirmed)
        else {
            return LeaseEnd::Unconfirmed;
        };
        match conn.silence {
            None => LeaseEnd::Never,
            Some(silence) => LeaseEnd::At(confirmed + silence.saturating_sub(LEASE_MARGIN)),
        }
    }

    /// The server answered a request sent at `sent` (with a result or a refusal): the session
    /// was alive then. Extends the lease, waking no one.
    fn confirm<T>(&mut self, sent: Instant, answer: &std::result::Result<T, sqlx::Error>) {
        if matches!(answer, Ok(_) | Err(sqlx::Error::Database(_))) {
            self.confirmed = Some(sent);
            let end = self.lease_end();
            self.life.send_if_modified(|l| {
                l.lease_end = end;
                false
            });
        }
    }

    fn error(&self, err: Error) -> Error {
        err.with_resource(&self.resource).with_store(&*self.store)
    }

    /// The connection is gone (closed, broken, in doubt): so is everything it held.
    fn drop_connection(&mut self) {
        self.conn = None;
        self.confirmed = None;
        if self.holds().is_some() {
            tracing::warn!(target: crate::logging::TARGET, resource = %self.resource,
                store = %self.store, "the session holding the advisory lock ended: lock lost");
            self.write = false;
            self.read = false;
            self.lost = Some(LostReason::Disconnected);
            self.ended += 1;
        }
        self.publish();
    }

    /// Nothing held any more: the connection goes back for the next holder.
    fn idle(&mut self) {
        if self.holds().is_none()
            && let Some(conn) = self.conn.take()
        {
            self.conns.put_back(conn);
        }
    }

    async fn ensure_connection(&mut self) -> Result<()> {
        if self.conn.is_some() {
            return Ok(());
        }
        match self.conns.get().await {
            Ok(conn) => {
                self.conn = Some(conn);
                self.publish();
                Ok(())
            }
            Err(e) => Err(self.error(connect_error(e))),
        }
    }

    /// Runs one short lock statement, under the statement timeout.
    async fn statement(&mut self, op: Op) -> Ran {
        let Some(conn) = self.conn.as_mut() else {
            return Ran::Broken("no connection".into());
        };
        let (timeout, sent) = (self.conns.config.statement_timeout, Instant::now());
        match tokio::time::timeout(timeout, conn.db.op(op, &self.id)).await {
            Ok(result) => {
                self.confirm(sent, &result);
                classify(result)
            }
            Err(_) => Ran::Broken(format!(
                "no answer within the statement timeout ({} s)",
                timeout.as_secs_f64()
            )),
        }
    }

    async fn save(&mut self, mode: Mode, wait: bool, mut reply: oneshot::Sender<Result<Saved>>) {
        let prior = self.holds();
        if prior == Some(mode) {
            // The holder already holds it this way: one hold, never stacked.
            let _ = reply.send(Ok(Saved::Acquired(Acquired::new())));
            return;
        }
        if reply.is_closed() {
            // The caller went before anything was sent: nothing to do, nothing to undo.
            return;
        }
        if let Err(err) = self.ensure_connection().await {
            let _ = reply.send(Err(err));
            return;
        }
        // A writer demoting takes its read lock with the waiting form: a session that holds a
        // conflicting lock goes ahead of the queue and is granted at once, where the trying form
        // would be refused because a writer waits.
        let demoting = prior == Some(Mode::Write);
        let op = if wait || demoting {
            Op::Wait(mode)
        } else {
            Op::Try(mode)
        };
        let mut ran = if wait || demoting {
            self.wait(op, &mut reply).await
        } else {
            self.statement(op).await
        };
        if let Ran::Broken(_) = ran
            && prior.is_none()
            && self.conn.as_ref().is_some_and(|c| c.reused)
            && !(reply.is_closed() || self.shutting_down || self.release_pending())
        {
            // An idle connection that went stale (the server restarted): once more, on a
            // fresh one. It held nothing, so nothing was lost.
            self.conn = None;
            match self.conns.connect().await {
                Ok(conn) => {
                    self.conn = Some(conn);
                    ran = if wait {
                        self.wait(op, &mut reply).await
                    } else {
                        self.statement(op).await
                    };
                }
                Err(e) => {
                    let _ = reply.send(Err(self.error(connect_error(e))));
                    return;
                }
            }
        }
        let ran = self.recheck_grant(ran, mode).await;
        let abandoned = reply.is_closed() || self.shutting_down || self.release_pending();
        let ping = wait && matches!(ran, Ran::Granted) && !abandoned;
        let mut answer = self.answer(ran, mode, abandoned).await;
        if ping && matches!(answer, Ok(Saved::Acquired(_))) {
            // A grant after a wait is confirmed as of the wait's start, maybe longer ago than
            // the server lets a silent session live: one round trip before the answer dates
            // the lease the caller reads from now (dated from the wait, it read as lost).
            self.ping().await;
            if self.holds().is_none() {
                answer = Err(self.error(
                    Error::storage("lost the connection to the database right after the grant")
                        .temporary(),
                ));
            }
        }
        let _ = reply.send(answer);
    }

    /// The answer to a lock statement that ran as `ran`: a grant nobody takes (`abandoned`)
    /// is taken back, a broken connection dropped, an error named.
    async fn answer(&mut self, ran: Ran, mode: Mode, abandoned: bool) -> Result<Saved> {
        match ran {
            Ran::Granted if abandoned => {
                // Nobody takes this grant: take back exactly what this statement added.
                self.unlock_one(mode).await;
                Ok(Saved::Conflict(Conflict::new().with_kept(self.holds())))
            }
            Ran::Granted => self.granted(mode).await,
            Ran::Refused => {
                self.idle();
                Ok(Saved::Conflict(Conflict::new().with_kept(self.holds())))
            }
            Ran::Cancelled if abandoned => {
                self.idle();
                Ok(Saved::Conflict(Conflict::new().with_kept(self.holds())))
            }
            Ran::Cancelled => {
                self.idle();
                Err(self.error(
                    Error::storage("the lock statement was cancelled by the server").temporary(),
                ))
            }
            Ran::Deadlock => {
                self.idle();
                Err(self.error(Error::conflict(&self.resource).with_reason(
                    "deadlock: another holder is promoting its read lock too; \
                 this one gave way and keeps its read lock",
                )))
            }
            Ran::Refusal(why) => {
                self.idle();
                Err(self.error(Error::storage(format!("the database refused: {why}"))))
            }
            Ran::Broken(why) => {
                self.drop_connection();
                Err(self.error(
                    Error::storage(format!("lost the connection to the database: {why}"))
                        .temporary(),
                ))
            }
        }
    }

    fn release_pending(&self) -> bool {
        self.deferred
            .iter()
            .any(|c| matches!(c, Cmd::Release { .. }))
    }

    /// The statement granted `mode`: record it, and finish a promotion or demotion by letting
    /// go of the other mode.
    async fn granted(&mut self, mode: Mode) -> Result<Saved> {
        let other = match mode {
            Mode::Write => self.read,
            Mode::Read => self.write,
        };
        match mode {
            Mode::Write => self.write = true,
            Mode::Read => self.read = true,
        }
        self.lost = None;
        if other {
            let unlock = match mode {
                Mode::Write => Op::Unlock(Mode::Read),
                Mode::Read => Op::Unlock(Mode::Write),
            };
            match self.statement(unlock).await {
                Ran::Granted | Ran::Refused => {}
                Ran::Broken(why) => {
                    self.drop_connection();
                    return Err(self.error(
                        Error::storage(format!("lost the connection to the database: {why}"))
                            .temporary(),
                    ));
                }
                _ => {
                    // In doubt about what the session holds: end it.
                    self.drop_connection();
                    return Err(self.error(Error::storage(
                        "could not finish changing the lock's mode; the session was closed",
                    )));
                }
            }
            match mode {
                Mode::Write => self.read = false,
                Mode::Read => self.write = false,
            }
        }
        self.publish();
        Ok(Saved::Acquired(Acquired::new()))
    }

    /// Takes back one hold in `mode` that nobody asked for any more. A cancel request that
    /// lands on the unlock instead of the wait it was meant for cancels it: once more then.
    async fn unlock_one(&mut self, mode: Mode) {
        for _ in 0..2 {
            match self.statement(Op::Unlock(mode)).await {
                Ran::Granted => {
                    self.idle();
                    return;
                }
                Ran::Cancelled => continue,
                _ => break,
            }
        }
        self.drop_connection();
    }

    async fn check(&mut self) -> Result<Holding> {
        let Some(mode) = self.holds() else {
            return Ok(Holding::NotHeld(self.lost.unwrap_or(LostReason::Removed)));
        };
        let Some(conn) = self.conn.as_mut() else {
            return Ok(Holding::NotHeld(LostReason::Disconnected));
        };
        let (timeout, sent) = (self.conns.config.statement_timeout, Instant::now());
        let answer = tokio::time::timeout(timeout, conn.db.check(&self.id)).await;
        if let Ok(answer) = &answer {
            self.confirm(sent, answer);
        }
        match answer {
            Ok(Ok((write, read))) => {
                let shown = match mode {
                    Mode::Write => write,
                    Mode::Read => read,
                };
                if shown {
                    Ok(Holding::Held(mode))
                } else {
                    // The session is alive but no longer holds: nothing but this task unlocks
                    // on it, so this would be a bug; the hold is reported lost, not pretended.
                    self.write = false;
                    self.read = false;
                    self.lost = Some(LostReason::Removed);
                    self.ended += 1;
                    self.publish();
                    self.idle();
                    Ok(Holding::NotHeld(LostReason::Removed))
                }
            }
            Ok(Err(e)) if !is_broken(&e) => Err(self.error(Error::storage(format!(
                "the database refused: {}",
                said(&e)
            )))),
            _ => {
                self.drop_connection();
                Ok(Holding::NotHeld(LostReason::Disconnected))
            }
        }
    }

    async fn ping(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let (timeout, sent) = (self.conns.config.statement_timeout, Instant::now());
        let answer = tokio::time::timeout(timeout, conn.db.ping()).await;
        if let Ok(answer) = &answer {
            self.confirm(sent, answer);
        }
        match answer {
            Ok(Ok(())) => {}
            Ok(Err(e)) if !is_broken(&e) => {}
            _ => self.drop_connection(),
        }
    }

    /// Unlocks every hold, each exactly once, checking each answer. `true` when something was
    /// held and every unlock said it was.
    async fn release(&mut self) -> Result<bool> {
        if self.holds().is_none() {
            self.idle();
            return Ok(false);
        }
        let mut all = true;
        for (held, mode) in [(self.write, Mode::Write), (self.read, Mode::Read)] {
            if !held {
                continue;
            }
            match self.statement(Op::Unlock(mode)).await {
                Ran::Granted => {}
                Ran::Refused => all = false,
                _ => {
                    // In doubt, or broken: closing the session is the release of last resort.
                    // Whether the lock was still held up to here cannot be told.
                    self.drop_connection();
                    self.lost = None;
                    self.publish();
                    return Ok(false);
                }
            }
        }
        self.write = false;
        self.read = false;
        self.lost = None;
        self.ended += 1;
        self.publish();
        if all {
            self.idle();
        } else {
            // An unlock the server says was not held: this session is not what it was
            // thought to be; never hand it to another holder.
            self.conn = None;
        }
        Ok(all)
    }
}
