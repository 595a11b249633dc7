//! The fair queue of the table store: `<table>_queue`, beside Symfony's `lock_keys`, in this
//! library's namespace (PHP and Python never read it). See `docs/sql.md`, "Fair queue".
//!
//! A waiter of this library (a holder whose lock registered a watch: it was refused once and
//! waits) has a **ticket**: the resource's wake id (`key_id`, or `s:` and the `key_id` for a
//! semaphore), its token, when its wait began (`since_us`, the waiter's clock, as on Redis and
//! in memory), a tie-breaker (`seq`, the database's clock in µs at its first insert), the
//! permits it asks for (0 for a lock) and an expiry (`expires_ms`, the database's clock).
//!
//! - Admission and the queue check are one statement (PostgreSQL's lock save) or one
//!   transaction (SQLite's lock save, every semaphore admission): a save that is not the
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
//!   [`TICKET_TTL`]; a waiter's watcher fires every [`TICKET_REFRESH`] so that its next save
//!   pushes the expiry forward even while nothing else wakes it.
//! - MySQL/MariaDB stay unfair for now (its save is one `INSERT … ON DUPLICATE KEY UPDATE`
//!   whose outcome comes back in `LAST_INSERT_ID`: the queue check would need a transaction,
//!   a round trip more).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::AssertSqlSafe;

use super::dialect::Flavor;
use super::ops::Run;
use super::queries::{Conn, on_conn};
use super::{HolderState, Inner, SqlStore};
use crate::mutex::lock;

type Db<T> = Result<T, sqlx::Error>;

/// How long a ticket outlives its waiter's last save: the longest a waiter whose process died
/// keeps the others out of a free lock.
pub(crate) const TICKET_TTL: Duration = Duration::from_secs(6);

/// How often a queued waiter's watcher fires, so that its save pushes its ticket's expiry
/// forward while no release wakes it.
pub(crate) const TICKET_REFRESH: Duration = Duration::from_secs(2);

/// The pause of a save kept out of a free lock by a queued waiter: the head normally takes the
/// lock within a round trip, and its release wakes the others.
pub(crate) const QUEUE_RECHECK: Duration = Duration::from_millis(100);

/// The `since_us` of a newcomer (not waiting): behind every ticket.
pub(crate) const NEWCOMER: i64 = i64::MAX;

/// The queue's table, beside `table`.
pub(crate) fn queue_table(table: &str) -> String {
    format!("{table}_queue")
}

/// The queue's statements on one database (PostgreSQL's parameters numbered `$n`, SQLite's
/// `?n`).
#[derive(Debug)]
pub(crate) struct QueueSql {
    /// The DDL.
    pub(crate) create: String,
    /// Queues a ticket (`q_id`, token, since, permits, ttl in ms) or pushes its expiry forward.
    pub(crate) enqueue: String,
    /// Deletes a ticket (`q_id`, token) without notifying (inside a transaction).
    pub(crate) unqueue: String,
    /// Deletes a ticket (`q_id`, token); PostgreSQL notifies (`channel`) when one went.
    pub(crate) leave: String,
    /// Whether a live ticket stands before the caller (`q_id`, token, since).
    pub(crate) blocked: String,
    /// The permits of the live tickets before the caller (`q_id`, token, since).
    pub(crate) ahead: String,
    /// Tickets expired for more than a minute.
    pub(crate) prune: String,
}

const PG_MILLIS: &str = "CAST(EXTRACT(epoch FROM statement_timestamp()) * 1000 AS BIGINT)";
const PG_MICROS: &str = "CAST(EXTRACT(epoch FROM statement_timestamp()) * 1000000 AS BIGINT)";
const LITE_SECONDS: &str = "((julianday('now') - 2440587.5) * 86400.0)";

/// The live tickets of `#1` queued before the caller (`#2`, waiting since `#3`): ranked by
/// (`since_us`, `seq`), the caller's own ticket's if it has one.
fn before(q: &str, ms: &str) -> String {
    format!(
        "FROM {q} o WHERE o.q_id = #1 AND o.token <> #2 AND o.expires_ms > {ms} \
         AND (o.since_us, o.seq) < \
         (COALESCE((SELECT m.since_us FROM {q} m WHERE m.q_id = #1 AND m.token = #2), #3), \
          COALESCE((SELECT m.seq FROM {q} m WHERE m.q_id = #1 AND m.token = #2), {NEWCOMER}))"
    )
}

impl QueueSql {
    /// The queue of `table`, on a database that has one (not MySQL).
    pub(crate) fn new(flavor: Flavor, table: &str) -> Option<QueueSql> {
        let q = queue_table(table);
        let (text, number, ms, micros, int) = match flavor {
            Flavor::Postgres => ("VARCHAR", "$", PG_MILLIS.to_owned(), PG_MICROS, "BIGINT"),
            Flavor::Sqlite => (
                "TEXT",
                "?",
                format!("CAST({LITE_SECONDS} * 1000 AS INTEGER)"),
                "CAST(((julianday('now') - 2440587.5) * 86400000000.0) AS INTEGER)",
                "INTEGER",
            ),
            Flavor::MySql => return None,
        };
        let n = |s: String| s.replace('#', number);
        let len = |l: u32| {
            if flavor == Flavor::Postgres {
                format!("{text}({l})")
            } else {
                text.to_owned()
            }
        };
        let leave = match flavor {
            Flavor::Postgres => format!(
                "WITH d AS (DELETE FROM {q} WHERE q_id = $1 AND token = $2 RETURNING q_id) \
                 SELECT pg_notify($3, d.q_id) FROM d"
            ),
            _ => format!("DELETE FROM {q} WHERE q_id = ?1 AND token = ?2"),
        };
        Some(QueueSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {q} (q_id {} NOT NULL, token {} NOT NULL, \
                 since_us {int} NOT NULL, seq {int} NOT NULL, permits INTEGER NOT NULL, \
                 expires_ms {int} NOT NULL, PRIMARY KEY (q_id, token))",
                len(66),
                len(64)
            ),
            enqueue: n(format!(
                "INSERT INTO {q} (q_id, token, since_us, seq, permits, expires_ms) \
                 VALUES (#1, #2, #3, {micros}, #4, {ms} + #5) \
                 ON CONFLICT (q_id, token) DO UPDATE SET expires_ms = excluded.expires_ms, \
                 permits = excluded.permits"
            )),
            leave,
            unqueue: n(format!("DELETE FROM {q} WHERE q_id = #1 AND token = #2")),
            blocked: n(format!("SELECT EXISTS (SELECT 1 {})", before(&q, &ms))),
            ahead: n(format!(
                "SELECT CAST(COALESCE(SUM(o.permits), 0) AS BIGINT) {}",
                before(&q, &ms)
            )),
            prune: format!("DELETE FROM {q} WHERE expires_ms < {ms} - 60000"),
        })
    }
}

/// PostgreSQL's fair lock save: `dialect::postgres_save` with the queue check in the same
/// statement. `$6` is the caller's `since_us` ([`NEWCOMER`] when it does not wait), `$7` a
/// ticket's lifetime in ms. The takeover of a free or expired row happens only when no live
/// ticket stands before the caller (`w`), or when the row is already the caller's (a re-save
/// is never kept out). A refused waiter queues its ticket (`qi`), an admitted one deletes it
/// (`qd`). The fifth column says the queue refused it.
pub(crate) fn postgres_fair_save(t: &str, f: &str, h: &str) -> String {
    let q = queue_table(t);
    let now = "CAST(EXTRACT(epoch FROM statement_timestamp()) AS INT)";
    let blocked = before(&q, PG_MILLIS)
        .replace("#1", "$1")
        .replace("#2", "$2")
        .replace("#3", "$6");
    format!(
        "WITH c AS (SELECT {now} AS s, EXTRACT(epoch FROM statement_timestamp()) AS f), \
         old AS (SELECT key_token, key_expiration FROM {t} WHERE key_id = $1), \
         w AS (SELECT EXISTS (SELECT 1 {blocked}) AS b), \
         up AS (INSERT INTO {t} AS l (key_id, key_token, key_expiration) \
                SELECT $1, $2, c.s + $3 FROM c, w \
                WHERE NOT w.b OR EXISTS (SELECT 1 FROM old WHERE old.key_token = $2) \
                ON CONFLICT (key_id) DO UPDATE \
                SET key_token = EXCLUDED.key_token, key_expiration = EXCLUDED.key_expiration \
                WHERE l.key_token = EXCLUDED.key_token \
                   OR (l.key_expiration <= (SELECT s FROM c) \
                       AND NOT EXISTS (SELECT 1 FROM old WHERE old.key_token = $2)) \
                RETURNING 1), \
         d AS (INSERT INTO {f} AS g (key_id, n) SELECT $1, {PG_MICROS} FROM up \
               WHERE NOT EXISTS (SELECT 1 FROM old WHERE old.key_token = $2) \
               ON CONFLICT (key_id) DO UPDATE SET n = g.n + 1 RETURNING g.n), \
         r AS (INSERT INTO {h} AS x (key_id, token, resource, record, at_ms) \
               SELECT $1, $2, $4, $5, {PG_MILLIS} FROM up \
               ON CONFLICT (key_id, token) DO UPDATE SET resource = EXCLUDED.resource, \
               record = EXCLUDED.record, at_ms = CASE WHEN EXISTS \
               (SELECT 1 FROM old WHERE old.key_token = $2) THEN x.at_ms \
               ELSE EXCLUDED.at_ms END), \
         qd AS (DELETE FROM {q} WHERE q_id = $1 AND token = $2 AND $6 < {NEWCOMER} \
                AND EXISTS (SELECT 1 FROM up)), \
         qi AS (INSERT INTO {q} AS o (q_id, token, since_us, seq, permits, expires_ms) \
                SELECT $1, $2, $6, {PG_MICROS}, 0, {PG_MILLIS} + $7 \
                WHERE $6 < {NEWCOMER} AND NOT EXISTS (SELECT 1 FROM up) \
                ON CONFLICT (q_id, token) DO UPDATE SET expires_ms = EXCLUDED.expires_ms) \
         SELECT EXISTS (SELECT 1 FROM up), (SELECT n FROM d), \
                (SELECT key_token FROM old), \
                (SELECT CAST((old.key_expiration - 0.5 - c.f) * 1000 AS BIGINT) FROM old, c), \
                (SELECT b FROM w)"
    )
}

/// The caller's place: when its wait began (µs since the epoch), or [`NEWCOMER`].
pub(crate) fn since_us(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(NEWCOMER - 1))
}

/// The ticket's lifetime in ms, as bound.
pub(crate) fn ticket_ms() -> i64 {
    i64::try_from(TICKET_TTL.as_millis()).unwrap_or(6000)
}

/// Queues (or refreshes) a ticket inside a transaction or on a connection `$on`.
macro_rules! enqueue {
    ($sql:expr, $on:expr, ($qid:expr, $token:expr), $since:expr, $permits:expr) => {
        sqlx::query(sqlx::AssertSqlSafe($sql.enqueue.as_str()))
            .bind($qid)
            .bind($token)
            .bind($since)
            .bind(i64::from($permits))
            .bind($crate::store::sql::queue::ticket_ms())
            .execute($on)
            .await
    };
}
pub(crate) use enqueue;

/// Deletes a ticket inside a transaction `$on` (an admitted waiter's): no notification, the
/// caller's commit is what the others see.
macro_rules! unqueue {
    ($sql:expr, $on:expr, ($qid:expr, $token:expr)) => {
        sqlx::query(sqlx::AssertSqlSafe($sql.unqueue.as_str()))
            .bind($qid)
            .bind($token)
            .execute($on)
            .await
    };
}
pub(crate) use unqueue;

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
    /// MySQL and MariaDB are not fair yet.
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
            let resource = String::new();
            let ids = (q_id.clone(), token);
            let left = store
                .run(&resource, Run::release(&store.inner), move |conn, inner| {
                    let (q_id, token) = ids.clone();
                    Box::pin(async move { leave_on(conn, inner, &q_id, &token).await })
                })
                .await;
            if let Err(err) = left {
                tracing::debug!(target: crate::logging::TARGET, error = %err,
                    "could not take a waiter's ticket out; it expires");
            }
            store.inner.wakers.notify(&q_id);
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
