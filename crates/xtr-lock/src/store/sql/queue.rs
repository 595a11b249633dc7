//! The fair queue of the table store: `<table>_queue`, beside Symfony's `lock_keys`, in this
//! library's namespace (PHP and Python never read it). See `docs/sql.md`, "Fair queue".
//!
//! A waiter of this library (a holder whose lock registered a watch: it was refused once and
//! waits) has a **ticket**: the resource's wake id (`key_id`, or `s:` and the `key_id` for a
//! semaphore), its token, when its wait began (`since_us`, the waiter's clock, as on Redis and
//! in memory), a tie-breaker (`seq`, the database's clock in µs at its first insert), the
//! permits it asks for (0 for a lock) and an expiry (`expires_ms`, the database's clock).
//!
//! - Admission and the queue check are one statement (PostgreSQL's lock save), one
//!   transaction (SQLite's lock save, every semaphore admission) or a look then a save
//!   (MySQL's lock save): a save that is not the
//!   holder's own row (a re-save or renewal never waits) is refused while a live ticket queued
//!   before it exists (a lock), or while its permits do not fit beside those of the live
//!   tickets before it (a semaphore). A newcomer (no ticket, not waiting) is behind every
//!   ticket, so it never takes a free lock past a live head.
//! - A refused waiter's save queues its ticket (or pushes its expiry forward); an admitted
//!   waiter's save deletes it. An uncontended acquire pays no extra round trip: the check is in
//!   the statement (PostgreSQL) or in-process (SQLite).
//! - A waiter that leaves (its last watcher dropped: cancelled, timed out) deletes its ticket
//!   in the background and wakes the resource's waiters; a save still on its way when its
//!   waiter left deletes the ticket it queued. A ticket whose process died expires after
//!   [`TICKET_TTL`](super::queue_sql::TICKET_TTL); a waiter's watcher fires every
//!   [`TICKET_REFRESH`] so that its next save pushes the expiry forward even while nothing
//!   else wakes it.
//! - MySQL/MariaDB's lock save looks at the row and the queue with a plain (non-locking)
//!   read first, then saves as an unfair store does, or queues: no statement holds a lock
//!   while it waits for another, so the queue adds no deadlock (see `queue_mysql`). Its
//!   semaphores check the queue in their admission's transaction, as everywhere.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use sqlx::AssertSqlSafe;

use super::queries::{Conn, on_conn};
use super::queue_sql::{NEWCOMER, QueueSql, since_us};
use super::{HolderState, Inner, SqlStore};
use crate::mutex::lock;

type Db<T> = Result<T, sqlx::Error>;

/// How often a queued waiter's watcher fires, so that its save pushes its ticket's expiry
/// forward while no release wakes it.
pub(crate) const TICKET_REFRESH: Duration = Duration::from_millis(1500);

/// The pause of a save kept out of a free lock by a queued waiter: the head normally takes the
/// lock within a round trip, and its release wakes the others.
pub(crate) const QUEUE_RECHECK: Duration = Duration::from_millis(100);

/// Deletes `(q_id, token)`'s ticket; PostgreSQL's waiters of `q_id` are notified.
pub(crate) async fn leave(
    conn: &mut Conn,
    sql: &QueueSql,
    (q_id, token): (&str, &str),
    channel: &str,
) -> Db<()> {
    let text = AssertSqlSafe(sql.leave.as_str());
    match conn {
        Conn::Postgres(p) => {
            sqlx::query(text)
                .bind(q_id)
                .bind(token)
                .bind(channel)
                .fetch_all(&mut **p)
                .await?;
        }
        other => {
            on_conn!(other, |c| {
                sqlx::query(text).bind(q_id).bind(token).execute(c).await?;
            });
        }
    }
    Ok(())
}

/// A watcher's hold on its holder's ticket: when a holder's last one goes while it still
/// waits (cancelled, timed out), its ticket is deleted in the background and the resource's
/// waiters are woken.
pub(crate) struct Place {
    store: SqlStore,
    state: Arc<HolderState>,
    q_id: String,
    token: String,
}

impl SqlStore {
    /// Serves waiters in arrival order (the default), or lets newcomers take a free lock
    /// whatever waiters queue (`false`, as `?fair=false`): see `docs/sql.md`, "Fair queue".
    pub fn with_fairness(&self, fair: bool) -> Self {
        self.rebuilt(|inner| inner.fair = fair)
    }

    /// Marks `state`'s holder as waiting since `since` and holds its place while the returned
    /// [`Place`] lives; `None` on a store without a queue.
    pub(super) fn hold_place(
        &self,
        state: &Arc<HolderState>,
        (q_id, token): (String, String),
        since: SystemTime,
    ) -> Option<Place> {
        self.inner.queue.as_ref()?;
        state.watchers.fetch_add(1, Ordering::AcqRel);
        *lock(&state.waiting) = Some(since_us(since));
        Some(Place {
            store: self.clone(),
            state: state.clone(),
            q_id,
            token,
        })
    }

    /// Deletes a ticket in the background and wakes the resource's waiters.
    fn leave_later(&self, q_id: String, token: String) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        handle.spawn(async move {
            let inner = &store.inner;
            let limit = inner.statement_timeout;
            let left = async {
                let mut conn = inner.pools.get()?.acquire(false).await?;
                let done = tokio::time::timeout(limit, leave_on(&mut conn, inner, &q_id, &token));
                match done.await {
                    Ok(done) => done,
                    Err(_) => {
                        // No answer: the connection is in doubt, closed instead of handed back.
                        conn.discard();
                        Err(sqlx::Error::PoolTimedOut)
                    }
                }
            };
            if !matches!(tokio::time::timeout(limit * 2, left).await, Ok(Ok(()))) {
                tracing::debug!(target: crate::logging::TARGET,
                    "could not take a waiter's ticket out; it expires");
            }
            inner.wakers.notify(&q_id);
        });
    }
}

/// The place a save of `state`'s holder carries on a fair store: its wait's start while it
/// waits, [`NEWCOMER`] otherwise.
pub(super) fn place_of(inner: &Inner, state: &HolderState) -> Option<i64> {
    inner.queue.as_ref()?;
    Some(lock(&state.waiting).unwrap_or(NEWCOMER))
}

/// Deletes a ticket on `conn` (no-op without a queue).
pub(super) async fn leave_on(conn: &mut Conn, inner: &Inner, q_id: &str, token: &str) -> Db<()> {
    match &inner.queue {
        Some(sql) => leave(conn, sql, (q_id, token), &inner.channel).await,
        None => Ok(()),
    }
}

/// After a save that queued `state`'s ticket: if its waiter left meanwhile (its last watcher
/// went while the save was on its way), the ticket goes again.
pub(super) async fn left_meanwhile(
    conn: &mut Conn,
    inner: &Inner,
    state: &HolderState,
    (q_id, token): (&str, &str),
) -> Db<()> {
    if lock(&state.waiting).is_none() {
        leave_on(conn, inner, q_id, token).await?;
        inner.wakers.notify(q_id);
    }
    Ok(())
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.state.watchers.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        if lock(&self.state.waiting).take().is_some() {
            self.store.leave_later(
                std::mem::take(&mut self.q_id),
                std::mem::take(&mut self.token),
            );
        }
    }
}
