//! MySQL/MariaDB's fair lock save: a look, then the unfair save.
//!
//! PostgreSQL checks the queue in the save's statement and SQLite in the save's write
//! transaction. On InnoDB a transaction that takes the lock row first (`SELECT … FOR UPDATE`)
//! gets only a gap lock where the row is missing, which every newcomer gets at once and then
//! waits on the others' for its insert: a deadlock (reproduced, `docs/sql.md`); and a queue
//! check inside the upsert makes one statement lock across two tables. So here nothing holds
//! a lock while it waits for another:
//!
//! 1. `look`: one plain `SELECT` (a consistent read: no locks) of the lock row and of whether a
//!    live ticket stands before the caller.
//! 2. Our own row (a re-save, never kept out) or a free row with nobody before us: the unfair
//!    save (`INSERT … ON DUPLICATE KEY UPDATE`, then the fencing draw and the holder's record),
//!    each statement in autocommit on one table. It decides again, atomically, on the row as it
//!    finds it: someone who took the row since the look refuses it as ever.
//! 3. Someone else's live row, or a free row kept for a waiter before us: refused, with
//!    nothing written (a newcomer) or the ticket queued (a waiter). An admitted waiter takes
//!    its ticket out after its save.
//!
//! Each of a save's statements locks rows of one table only, and the save holds nothing
//! between them: no cycle of waits can form with another save, a semaphore's admission (which
//! takes its semaphore's row, then the queue) or a Symfony peer (one table). What the look
//! sees may be a moment old: a ticket queued just after it does not stop a newcomer already
//! past it, as on PostgreSQL, where a waiter's ticket is queued from its second save on.

use sqlx::AssertSqlSafe;

use super::dialect::Sql;
use super::queries::{self, Conn, Row, Saved};
use super::queue_sql::{NEWCOMER, QueueSql, enqueue, unqueue};
use super::records::Rec;

type Db<T> = Result<T, sqlx::Error>;

/// Acquires `id` for `token` as [`queries::save`] does; on MySQL with a queue (`fair`), looks
/// at the row and the queue first (see the module's docs).
pub(super) async fn save(
    conn: &mut Conn,
    sql: &Sql,
    ids: (&str, &str),
    ttl: i32,
    (rec, fair): (&Rec<'_>, Option<(&QueueSql, i64)>),
) -> Db<Saved> {
    match fair {
        Some(queue) if matches!(conn, Conn::MySql(_)) => {
            save_mysql(conn, sql, ids, ttl, (rec, queue)).await
        }
        _ => queries::save(conn, sql, ids, ttl, (rec, fair)).await,
    }
}

/// The look's answer: the row's token, whether it is live, its ms left; whether a live ticket
/// stands before the caller.
type Look = (Option<String>, Option<i64>, Option<i64>, i64);

async fn save_mysql(
    conn: &mut Conn,
    sql: &Sql,
    (id, token): (&str, &str),
    ttl: i32,
    (rec, (q, since)): (&Rec<'_>, (&QueueSql, i64)),
) -> Db<Saved> {
    let Conn::MySql(p) = conn else {
        unreachable!("MySQL's save on another database");
    };
    let (held_by, live, left_ms, blocked): Look = sqlx::query_as(AssertSqlSafe(q.look.as_str()))
        .bind(id)
        .bind(token)
        .bind(since)
        .fetch_one(&mut **p)
        .await?;
    let found = held_by.map(|token| Row {
        token,
        live: live == Some(1),
        left_ms,
    });
    let mine = found.as_ref().is_some_and(|r| r.token == token);
    let taken = !mine && found.as_ref().is_some_and(|r| r.live);
    let queued = !mine && !taken && blocked == 1;
    let waiter = since < NEWCOMER;
    if taken || queued {
        if waiter {
            enqueue!(q, &mut **p, (id, token), since, 0u32)?;
        }
        return Ok(Saved::Conflict {
            holder: found,
            queued,
        });
    }
    let saved = queries::save(conn, sql, (id, token), ttl, (rec, None)).await?;
    if waiter {
        let Conn::MySql(p) = conn else {
            unreachable!("MySQL's save on another database");
        };
        match saved {
            Saved::Acquired { .. } => unqueue!(q, &mut **p, (id, token))?,
            Saved::Conflict { .. } => enqueue!(q, &mut **p, (id, token), since, 0u32)?,
        };
    }
    Ok(saved)
}
