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

use tokio::sync::{mpsc, oneshot, watch};

use super::conns::{Conn, ConnectError, Conns};
use crate::error::{Error, LostReason, Result};
use crate::key::Mode;
use crate::store::{Acquired, Conflict, Holding, Saved};

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
    /// The backend pid of the session's connection, while it has one.
    pub(super) pid: Option<i32>,
}

/// The caller's end of a session.
pub(super) struct Session {
    pub(super) tx: mpsc::UnboundedSender<Cmd>,
    pub(super) life: watch::Receiver<Life>,
}

const TRY_WRITE: &str = "SELECT pg_try_advisory_lock($1)";
const TRY_READ: &str = "SELECT pg_try_advisory_lock_shared($1)";
const WAIT_WRITE: &str = "SELECT true FROM pg_advisory_lock($1)";
const WAIT_READ: &str = "SELECT true FROM pg_advisory_lock_shared($1)";
const UNLOCK_WRITE: &str = "SELECT pg_advisory_unlock($1)";
const UNLOCK_READ: &str = "SELECT pg_advisory_unlock_shared($1)";
/// This session's holds on the key, from `pg_locks`: the database, both halves of the key and
/// the single-`bigint` form (`objsubid = 1`) together.
const CHECK: &str = "SELECT coalesce(bool_or(mode = 'ExclusiveLock'), false), \
     coalesce(bool_or(mode = 'ShareLock'), false) FROM pg_locks \
     WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid() \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1";

/// Starts the session task of one holder of `key` (the advisory key of `resource`).
pub(super) fn start(conns: Arc<Conns>, key: i64, resource: String, store: Arc<str>) -> Session {
    let (tx, rx) = mpsc::unbounded_channel();
    let (life_tx, life) = watch::channel(Life::default());
    let actor = Actor {
        conns,
        key,
        resource,
        store,
        conn: None,
        write: false,
        read: false,
        lost: None,
        ended: 0,
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
    key: i64,
    resource: String,
    store: Arc<str>,
    conn: Option<Conn>,
    write: bool,
    read: bool,
    lost: Option<LostReason>,
    ended: u64,
    life: watch::Sender<Life>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    /// Commands that came during a wait and must run after it.
    deferred: VecDeque<Cmd>,
    /// The holder's handle went: finish, unlock, and stop.
    shutting_down: bool,
}

/// How a lock statement ended.
enum Ran {
    Granted,
    Refused,
    /// Cancelled (SQLSTATE 57014): by this session's own cancel request, or an operator's.
    Cancelled,
    /// A deadlock (40P01): two holders promoting at once; this one was chosen to give way.
    Deadlock,
    /// The server refused with another error; the connection is still fine.
    Refusal(String),
    /// The connection broke or stopped answering: it is gone.
    Broken(String),
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
                let keepalive = self.conns.config.keepalive;
                tokio::select! {
                    cmd = self.rx.recv() => match cmd {
                        Some(cmd) => cmd,
                        None => break,
                    },
                    () = tokio::time::sleep(keepalive) => {
                        self.keepalive().await;
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
        };
        self.life.send_if_modified(|l| {
            let changed = *l != life;
            *l = life;
            changed
        });
    }

    fn error(&self, err: Error) -> Error {
        err.with_resource(&self.resource).with_store(&*self.store)
    }

    /// The connection is gone (closed, broken, in doubt): so is everything it held.
    fn drop_connection(&mut self) {
        self.conn = None;
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

    /// Runs one short statement that answers a boolean, under the statement timeout.
    async fn run_bool(&mut self, sql: &'static str) -> Ran {
        let Some(conn) = self.conn.as_mut() else {
            return Ran::Broken("no connection".into());
        };
        let timeout = self.conns.config.statement_timeout;
        let query = sqlx::query_scalar::<_, bool>(sql)
            .bind(self.key)
            .fetch_one(&mut conn.pg);
        match tokio::time::timeout(timeout, query).await {
            Ok(result) => classify(result),
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
        if let Err(err) = self.ensure_connection().await {
            let _ = reply.send(Err(err));
            return;
        }
        // A writer demoting takes its read lock with the waiting form: a session that holds a
        // conflicting lock goes ahead of the queue and is granted at once, where the trying form
        // would be refused because a writer waits.
        let demoting = prior == Some(Mode::Write);
        let sql = match (mode, wait || demoting) {
            (Mode::Write, false) => TRY_WRITE,
            (Mode::Read, false) => TRY_READ,
            (Mode::Write, true) => WAIT_WRITE,
            (Mode::Read, true) => WAIT_READ,
        };
        let mut ran = if wait || demoting {
            self.wait(sql, &mut reply).await
        } else {
            self.run_bool(sql).await
        };
        if let Ran::Broken(_) = ran
            && prior.is_none()
            && self.conn.as_ref().is_some_and(|c| c.reused)
        {
            // An idle connection that went stale (the server restarted): once more, on a
            // fresh one. It held nothing, so nothing was lost.
            self.conn = None;
            match self.conns.connect().await {
                Ok(conn) => {
                    self.conn = Some(conn);
                    ran = if wait {
                        self.wait(sql, &mut reply).await
                    } else {
                        self.run_bool(sql).await
                    };
                }
                Err(e) => {
                    let _ = reply.send(Err(self.error(connect_error(e))));
                    return;
                }
            }
        }
        let abandoned = reply.is_closed() || self.shutting_down || self.release_pending();
        let answer = match ran {
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
        };
        let _ = reply.send(answer);
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
                Mode::Write => UNLOCK_READ,
                Mode::Read => UNLOCK_WRITE,
            };
            match self.run_bool(unlock).await {
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
        let sql = match mode {
            Mode::Write => UNLOCK_WRITE,
            Mode::Read => UNLOCK_READ,
        };
        for _ in 0..2 {
            match self.run_bool(sql).await {
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

    /// A lock statement that waits in the server, watched: a caller that goes away, a release
    /// of the same holder, or the holder's handle going cancel it; other commands are answered
    /// from what the session holds, or wait their turn.
    async fn wait(&mut self, sql: &'static str, reply: &mut oneshot::Sender<Result<Saved>>) -> Ran {
        let key = self.key;
        let conns = self.conns.clone();
        let held = self.holds();
        let Actor {
            conn,
            rx,
            deferred,
            shutting_down,
            ..
        } = self;
        let Some(conn) = conn.as_mut() else {
            return Ran::Broken("no connection".into());
        };
        let pid = conn.pid;
        let statement = sqlx::query_scalar::<_, bool>(sql)
            .bind(key)
            .fetch_one(&mut conn.pg);
        tokio::pin!(statement);
        let mut cancel: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
        let mut reading = true;
        let result = loop {
            tokio::select! {
                result = &mut statement => break result,
                () = reply.closed(), if cancel.is_none() => {
                    cancel = Some(spawn_cancel(&conns, pid));
                }
                cmd = rx.recv(), if reading => match cmd {
                    None => {
                        *shutting_down = true;
                        reading = false;
                        if cancel.is_none() {
                            cancel = Some(spawn_cancel(&conns, pid));
                        }
                    }
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
                        if cancel.is_none() {
                            cancel = Some(spawn_cancel(&conns, pid));
                        }
                    }
                },
                // A cancel that could not be delivered (the server does not answer): the
                // connection is closed after a statement timeout, which frees what it held.
                () = tokio::time::sleep(conns.config.statement_timeout),
                    if cancel.as_ref().is_some_and(|c| c.is_finished()) => {
                    return Ran::Broken("a cancelled lock wait did not end".into());
                }
            }
        };
        if let Some(cancel) = cancel {
            // Delivered before the next statement, so it cannot cancel that one instead
            // (one that still does is retried: see unlock_one).
            if let Ok(Err(why)) = cancel.await {
                tracing::debug!(target: crate::logging::TARGET, error = %why,
                    "a cancel request for an advisory lock wait failed");
            }
        }
        classify(result)
    }

    async fn check(&mut self) -> Result<Holding> {
        let Some(mode) = self.holds() else {
            return Ok(Holding::NotHeld(self.lost.unwrap_or(LostReason::Removed)));
        };
        let Some(conn) = self.conn.as_mut() else {
            return Ok(Holding::NotHeld(LostReason::Disconnected));
        };
        let (classid, objid) = super::keys::pg_locks_ids(self.key);
        let timeout = self.conns.config.statement_timeout;
        let query = sqlx::query_as::<_, (bool, bool)>(CHECK)
            .bind(classid)
            .bind(objid)
            .fetch_one(&mut conn.pg);
        match tokio::time::timeout(timeout, query).await {
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
            Ok(Err(e)) if !is_connection_error(&e) => {
                Err(self.error(Error::storage(format!("the database refused: {e}"))))
            }
            _ => {
                self.drop_connection();
                Ok(Holding::NotHeld(LostReason::Disconnected))
            }
        }
    }

    async fn keepalive(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let timeout = self.conns.config.statement_timeout;
        let ping = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&mut conn.pg);
        match tokio::time::timeout(timeout, ping).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if !is_connection_error(&e) => {}
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
        for (held, sql) in [(self.write, UNLOCK_WRITE), (self.read, UNLOCK_READ)] {
            if !held {
                continue;
            }
            match self.run_bool(sql).await {
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

fn spawn_cancel(conns: &Arc<Conns>, pid: i32) -> tokio::task::JoinHandle<Result<(), String>> {
    let conns = conns.clone();
    tokio::spawn(async move { conns.cancel(pid).await })
}

fn classify(result: std::result::Result<bool, sqlx::Error>) -> Ran {
    match result {
        Ok(true) => Ran::Granted,
        Ok(false) => Ran::Refused,
        Err(sqlx::Error::Database(d)) => match d.code().as_deref() {
            Some("57014") => Ran::Cancelled,
            Some("40P01") => Ran::Deadlock,
            // The server is shutting down, or an operator terminated the backend.
            Some("57P01" | "57P02" | "57P03") => Ran::Broken(d.message().to_owned()),
            _ => Ran::Refusal(d.message().to_owned()),
        },
        Err(e) if is_connection_error(&e) => Ran::Broken(e.to_string()),
        Err(e) => Ran::Refusal(e.to_string()),
    }
}

fn is_connection_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(d) => {
            matches!(d.code().as_deref(), Some("57P01" | "57P02" | "57P03"))
        }
        _ => false,
    }
}

fn connect_error(e: ConnectError) -> Error {
    match e {
        ConnectError::TimedOut(t) => Error::storage(format!(
            "cannot reach the database: no connection within the connect timeout ({} s)",
            t.as_secs_f64()
        ))
        .temporary(),
        ConnectError::Sqlx(e) => {
            let temporary = is_connection_error(&e);
            let err = Error::storage(format!("cannot connect to the database: {e}"));
            if temporary { err.temporary() } else { err }
        }
    }
}
