//! The fair queue's table and statements (`<table>_queue`): see `queue` for how the store
//! uses them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::dialect::{Flavor, PgQueue, Sql, holder_table, postgres_save};

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
/// `?n`, MySQL's `?` each bound once, in the same order).
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
    /// MySQL: the lock row (token, live, ms left) and whether a live ticket stands before the
    /// caller (`q_id`, token, since), read without locking before a lock's save (see
    /// `queue_mysql`); empty elsewhere.
    pub(crate) look: String,
}

const PG_MILLIS: &str = "CAST(EXTRACT(epoch FROM statement_timestamp()) * 1000 AS BIGINT)";
const PG_MICROS: &str = "CAST(EXTRACT(epoch FROM statement_timestamp()) * 1000000 AS BIGINT)";
const MY_MILLIS: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000 AS SIGNED)";
const MY_MICROS: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)";
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

/// MySQL's: the same tickets, the caller's values bound once each (`?` cannot be numbered) in
/// a derived row `p` (`qid`, `tok`, `since`). Compared with the table's `utf8mb4_bin`
/// columns, the bound values compare as bytes, whatever the connection's collation.
fn before_mysql(q: &str) -> String {
    format!(
        "FROM {q} o LEFT JOIN {q} m ON m.q_id = p.qid AND m.token = p.tok \
         WHERE o.q_id = p.qid AND o.token <> p.tok AND o.expires_ms > {MY_MILLIS} \
         AND (o.since_us, o.seq) < (COALESCE(m.since_us, p.since), COALESCE(m.seq, {NEWCOMER}))"
    )
}

/// The caller's values as MySQL's derived row `p`.
const MY_PARAMS: &str = "(SELECT ? AS qid, ? AS tok, ? AS since) p";

impl QueueSql {
    /// The queue of `table`.
    pub(crate) fn new(flavor: Flavor, table: &str) -> QueueSql {
        if flavor == Flavor::MySql {
            return QueueSql::mysql(table);
        }
        let q = queue_table(table);
        let (text, number, ms, micros, int) = match flavor {
            Flavor::Sqlite => (
                "TEXT",
                "?",
                format!("CAST({LITE_SECONDS} * 1000 AS INTEGER)"),
                "CAST(((julianday('now') - 2440587.5) * 86400000000.0) AS INTEGER)",
                "INTEGER",
            ),
            _ => ("VARCHAR", "$", PG_MILLIS.to_owned(), PG_MICROS, "BIGINT"),
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
        QueueSql {
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
            look: String::new(),
        }
    }

    /// MySQL's queue: the same table and statements; a lock's save first looks (`look`).
    fn mysql(table: &str) -> QueueSql {
        let q = queue_table(table);
        let ms = MY_MILLIS;
        let delete = format!("DELETE FROM {q} WHERE q_id = ? AND token = ?");
        // The expiry is pushed forward only once the ticket is 2 s old: the permits first,
        // while `expires_ms` is still the old one (the assignments run left to right).
        let stale = format!("expires_ms < VALUES(expires_ms) - {REFRESH_MS}");
        QueueSql {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {q} (q_id VARCHAR(66) NOT NULL, \
                 token VARCHAR(64) NOT NULL, since_us BIGINT NOT NULL, seq BIGINT NOT NULL, \
                 permits INTEGER NOT NULL, expires_ms BIGINT NOT NULL, \
                 PRIMARY KEY (q_id, token)) COLLATE utf8mb4_bin, ENGINE = InnoDB"
            ),
            enqueue: format!(
                "INSERT INTO {q} (q_id, token, since_us, seq, permits, expires_ms) \
                 VALUES (?, ?, ?, {MY_MICROS}, ?, {ms} + ?) ON DUPLICATE KEY UPDATE \
                 permits = IF({stale}, VALUES(permits), permits), \
                 expires_ms = IF({stale}, VALUES(expires_ms), expires_ms)"
            ),
            unqueue: delete.clone(),
            leave: delete,
            blocked: format!(
                "SELECT CAST(EXISTS (SELECT 1 {}) AS SIGNED) FROM {MY_PARAMS}",
                before_mysql(&q)
            ),
            ahead: format!(
                "SELECT CAST((SELECT COALESCE(SUM(o.permits), 0) {}) AS SIGNED) FROM {MY_PARAMS}",
                before_mysql(&q)
            ),
            prune: format!("DELETE FROM {q} WHERE expires_ms < {ms} - 60000"),
            look: format!(
                "SELECT l.key_token, CAST(l.key_expiration > UNIX_TIMESTAMP() AS SIGNED), \
                 CAST((l.key_expiration - UNIX_TIMESTAMP(NOW(6))) * 1000 AS SIGNED), \
                 CAST(EXISTS (SELECT 1 {}) AS SIGNED) \
                 FROM {MY_PARAMS} LEFT JOIN {table} l ON l.key_id = p.qid",
                before_mysql(&q)
            ),
        }
    }
}

/// PostgreSQL's fair lock save: `dialect::postgres_save` with the queue check in the same
/// statement. `$6` is the caller's `since_us` ([`NEWCOMER`] when it does not wait), `$7` a
/// ticket's lifetime in ms. A refused waiter queues its ticket (`qi`), an admitted one deletes
/// it (`qd`).
pub(crate) fn postgres_fair_save(t: &str, f: &str, h: &str) -> String {
    let q = queue_table(t);
    let blocked = before(&q, PG_MILLIS)
        .replace("#1", "$1")
        .replace("#2", "$2")
        .replace("#3", "$6");
    let ctes = format!(
        "qd AS (DELETE FROM {q} WHERE q_id = $1 AND token = $2 AND $6 < {NEWCOMER} \
                AND EXISTS (SELECT 1 FROM up)), \
         qi AS (INSERT INTO {q} AS o (q_id, token, since_us, seq, permits, expires_ms) \
                SELECT $1, $2, $6, {PG_MICROS}, 0, {PG_MILLIS} + $7 \
                WHERE $6 < {NEWCOMER} AND NOT EXISTS (SELECT 1 FROM up) \
                ON CONFLICT (q_id, token) DO UPDATE SET expires_ms = EXCLUDED.expires_ms \
                WHERE o.expires_ms < EXCLUDED.expires_ms - {REFRESH_MS})"
    );
    postgres_save(t, f, h, Some(&PgQueue { blocked, ctes }))
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
/// transaction, MySQL's looks before it: `queue_mysql`).
pub(crate) fn fair_statements(sql: &mut Sql, flavor: Flavor, table: &str) {
    if flavor == Flavor::Postgres {
        let (f, h) = (format!("{table}_fence"), holder_table(table));
        sql.save = postgres_fair_save(table, &f, &h);
    }
}
