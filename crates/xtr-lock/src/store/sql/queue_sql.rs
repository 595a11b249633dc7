//! The fair queue's table and statements (`<table>_queue`): see `queue` for how the store
//! uses them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::dialect::{Flavor, Sql, holder_table};

/// How long a ticket outlives its waiter's last save: the longest a waiter whose process died
/// keeps the others out of a free lock.
pub(crate) const TICKET_TTL: Duration = Duration::from_secs(6);

/// A queued ticket's expiry is pushed forward only once it is this old (ms): a waiter's
/// refused saves in between write nothing (on SQLite a write transaction that changed nothing
/// commits without touching the file). Its watcher fires every 1.5 s, so the expiry is pushed
/// 2 to 3.5 s after the last push: a live waiter's ticket keeps at least 2.5 s in hand.
const REFRESH_MS: i64 = 2000;

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
                 permits = excluded.permits \
                 WHERE {q}.expires_ms < excluded.expires_ms - {REFRESH_MS}"
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
                ON CONFLICT (q_id, token) DO UPDATE SET expires_ms = EXCLUDED.expires_ms \
                WHERE o.expires_ms < EXCLUDED.expires_ms - {REFRESH_MS}) \
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
            .bind($crate::store::sql::queue_sql::ticket_ms())
            .execute($on)
            .await
    };
}
pub(crate) use enqueue;

/// Inside a transaction `$on`: the permits the live tickets queued before `(q_id, token)`
/// (waiting since `$since`) ask for.
macro_rules! queued_ahead {
    ($sql:expr, $on:expr, ($qid:expr, $token:expr), $since:expr) => {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe($sql.ahead.as_str()))
            .bind($qid)
            .bind($token)
            .bind($since)
            .fetch_one($on)
            .await
            .map(|ahead| u64::try_from(ahead).unwrap_or(0))
    };
}
pub(crate) use queued_ahead;

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

/// A fair store's statements: PostgreSQL's save checks the queue (SQLite's checks it in its
/// transaction; MySQL has no queue).
pub(crate) fn fair_statements(sql: &mut Sql, flavor: Flavor, table: &str) {
    if flavor == Flavor::Postgres {
        let (f, h) = (format!("{table}_fence"), holder_table(table));
        sql.save = postgres_fair_save(table, &f, &h);
    }
}
