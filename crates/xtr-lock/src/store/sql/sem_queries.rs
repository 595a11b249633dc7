//! The statements of each semaphore operation, on a connection of one of the three pools. The
//! same code runs on each (a macro writes it out per driver); results are plain values.

use sqlx::AssertSqlSafe;

use super::queries::{Conn, on_conn};
use super::queue_sql::{NEWCOMER, QueueSql, enqueue, queued_ahead, unqueue};
use super::records::{Rec, record_of, upsert_record};
use super::sem_sql::SemSql;
use crate::meta::HolderRecord;
use crate::permits::Permits;

type Db<T> = Result<T, sqlx::Error>;

/// A live holder as a statement found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) token: String,
    pub(crate) permits: u32,
    /// Milliseconds until its row can be taken, by the database's clock.
    pub(crate) left_ms: i64,
}

fn holder((token, permits, left): (String, i64, Option<i64>)) -> Holder {
    Holder {
        token,
        permits: u32::try_from(permits.max(0)).unwrap_or(u32::MAX),
        left_ms: left.unwrap_or(0).max(0),
    }
}

/// What an admission did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// The holder holds: `fence` is its new fencing token, `None` for a re-save the caller
    /// knew for one.
    Taken { fence: Option<u64> },
    /// Too few permits free: the live holders met.
    Full { holders: Vec<Holder> },
    /// The holders use another limit (stored).
    Mismatch { stored: u32 },
    /// The holder holds this many permits and asked for another count.
    CountChanged { held: u32 },
}

/// What the admission rule decides for `token` among the live `holders`, under `stored`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// Already holds: refresh.
    Resave,
    /// Already holds this many permits, and asks for another count.
    CountChanged(u32),
    /// Fits: insert, first storing the holder's limit when nobody holds.
    Take {
        set_limit: bool,
    },
    Full,
    Mismatch,
}

/// The limit rule and the count: the stored limit binds while anybody holds; once nobody holds
/// the next holder's is stored.
pub(crate) fn rule(stored: u32, holders: &[Holder], token: &str, p: Permits) -> Rule {
    if let Some(h) = holders.iter().find(|h| h.token == token) {
        if h.permits != p.count() {
            return Rule::CountChanged(h.permits);
        }
        return Rule::Resave;
    }
    let used: u64 = holders.iter().map(|h| u64::from(h.permits)).sum();
    if used > 0 && stored != p.limit() {
        return Rule::Mismatch;
    }
    if used + u64::from(p.count()) > u64::from(p.limit()) {
        return Rule::Full;
    }
    Rule::Take {
        set_limit: used == 0 && stored != p.limit(),
    }
}

fn limit_of(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// Inside `$tx`: makes the semaphore's row if missing and locks it, deletes its expired
/// holders, and reads its stored limit, fencing counter and live holders.
macro_rules! locked_state {
    ($tx:expr, $sql:expr, $id:expr, $p:expr) => {{
        sqlx::query(AssertSqlSafe($sql.ensure.as_str()))
            .bind($id)
            .bind(i64::from($p.limit()))
            .execute(&mut *$tx)
            .await?;
        let (stored, n): (i64, i64) = sqlx::query_as(AssertSqlSafe($sql.lock.as_str()))
            .bind($id)
            .fetch_one(&mut *$tx)
            .await?;
        sqlx::query(AssertSqlSafe($sql.purge.as_str()))
            .bind($id)
            .execute(&mut *$tx)
            .await?;
        let rows: Vec<(String, i64, Option<i64>)> =
            sqlx::query_as(AssertSqlSafe($sql.list.as_str()))
                .bind($id)
                .fetch_all(&mut *$tx)
                .await?;
        let holders: Vec<Holder> = rows.into_iter().map(holder).collect();
        (limit_of(stored), n, holders)
    }};
}

/// Inside `$tx`: extends the holder's own live row by `$ttl`; how many rows it extended.
macro_rules! refresh_row {
    ($tx:expr, $sql:expr, ($id:expr, $token:expr), $ttl:expr) => {
        sqlx::query(AssertSqlSafe($sql.refresh.as_str()))
            .bind($ttl)
            .bind($id)
            .bind($token)
            .execute(&mut *$tx)
            .await?
            .rows_affected()
    };
}

/// Inside `$tx`: adds the holder's row (storing its limit first where the rule says so).
macro_rules! take {
    ($tx:expr, $sql:expr, ($id:expr, $token:expr), $p:expr, $ttl:expr, $set_limit:expr) => {{
        if $set_limit {
            sqlx::query(AssertSqlSafe($sql.set_limit.as_str()))
                .bind(i64::from($p.limit()))
                .bind($id)
                .execute(&mut *$tx)
                .await?;
        }
        sqlx::query(AssertSqlSafe($sql.insert.as_str()))
            .bind($id)
            .bind($token)
            .bind(i64::from($p.count()))
            .bind($ttl)
            .execute(&mut *$tx)
            .await?;
    }};
}

/// Admits `token` for `p` and `ttl` whole seconds, in one transaction that holds the
/// semaphore's row: the expired holders go, the live ones are counted, and the holder is added
/// if it fits. `known` says the holder's row was certainly live as the statement went out (a
/// re-save then draws no new fencing token). `fair`: the queue and the caller's place in it: a
/// holder that would fit is kept out while its permits do not fit beside those of the live
/// waiters queued before it; a refused waiter queues its ticket, an admitted one takes it out.
pub(crate) async fn admit(
    conn: &mut Conn,
    (sql, rec, fair): (&SemSql, &Rec<'_>, Option<(&QueueSql, i64)>),
    ids: (&str, &str),
    p: Permits,
    ttl: i64,
    known: bool,
) -> Db<Admitted> {
    let (id, token) = ids;
    let rec_id = format!("s:{id}");
    let waiter = fair.filter(|(_, since)| *since < NEWCOMER);
    let sqlite = matches!(conn, Conn::Sqlite(_));
    on_conn!(conn, |c| {
        let mut tx = if sqlite {
            sqlx::Connection::begin_with(c, "BEGIN IMMEDIATE").await?
        } else {
            sqlx::Connection::begin(c).await?
        };
        let (stored, n, holders) = locked_state!(tx, sql, id, p);
        let mut rule = rule(stored, &holders, token, p);
        if let (Rule::Take { .. }, Some((q, since))) = (rule, fair) {
            // Its permits must fit beside those of the waiters queued before it too.
            let ahead = queued_ahead!(q, &mut *tx, (&rec_id, token), since)?;
            let used: u64 = holders.iter().map(|h| u64::from(h.permits)).sum();
            if used + ahead + u64::from(p.count()) > u64::from(p.limit()) {
                rule = Rule::Full;
            }
        }
        // Whether the holder draws a fencing token, or why it is refused.
        let drawn: Result<bool, Admitted> = match rule {
            Rule::Mismatch => Err(Admitted::Mismatch { stored }),
            Rule::CountChanged(held) => Err(Admitted::CountChanged { held }),
            Rule::Full => Err(Admitted::Full { holders }),
            // A row that ended between the listing and the refresh (each statement reads the
            // database's clock) is not held and not revived: the next attempt purges it and
            // admits afresh.
            Rule::Resave => match refresh_row!(tx, sql, (id, token), ttl) {
                1 => Ok(!known),
                _ => Err(Admitted::Full { holders }),
            },
            Rule::Take { set_limit } => {
                take!(tx, sql, (id, token), p, ttl, set_limit);
                Ok(true)
            }
        };
        let draw = match drawn {
            Ok(draw) => draw,
            Err(refused) => {
                if let (Admitted::Full { .. }, Some((q, since))) = (&refused, waiter) {
                    enqueue!(q, &mut *tx, (&rec_id, token), since, p.count())?;
                }
                tx.commit().await?;
                return Ok(refused);
            }
        };
        if let Some((q, _)) = waiter {
            unqueue!(q, &mut *tx, (&rec_id, token))?;
        }
        let fence = if draw {
            sqlx::query(AssertSqlSafe(sql.set_n.as_str()))
                .bind(n + 1)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            u64::try_from(n + 1).ok()
        } else {
            None
        };
        // The holder's record, in the same transaction (one more statement: the admission
        // runs several already). A re-save keeps its acquisition time.
        upsert_record!(rec, &mut *tx, (&rec_id, token), draw, fence)?;
        tx.commit().await?;
        Ok(Admitted::Taken { fence })
    })
}

/// Our row: `Some(true)` while live, `Some(false)` once expired, `None` when gone.
pub(crate) async fn own(conn: &mut Conn, sql: &SemSql, id: &str, token: &str) -> Db<Option<bool>> {
    let text = AssertSqlSafe(sql.own.as_str());
    let live: Option<i64> = on_conn!(conn, |c| {
        sqlx::query_scalar(text)
            .bind(id)
            .bind(token)
            .fetch_optional(c)
            .await?
    });
    Ok(live.map(|l| l == 1))
}

/// Extends our live row to now + `ttl`; whether it did.
pub(crate) async fn refresh(
    conn: &mut Conn,
    sql: &SemSql,
    id: &str,
    token: &str,
    ttl: i64,
) -> Db<bool> {
    let text = AssertSqlSafe(sql.refresh.as_str());
    let done = on_conn!(conn, |c| {
        sqlx::query(text)
            .bind(ttl)
            .bind(id)
            .bind(token)
            .execute(c)
            .await?
            .rows_affected()
    });
    if done > 0 {
        return Ok(true);
    }
    // MySQL without CLIENT_FOUND_ROWS counts an unchanged row (our own refresh within the same
    // second) as 0: the row says whether it is still ours and live.
    if matches!(conn, Conn::MySql(_)) {
        return Ok(own(conn, sql, id, token).await? == Some(true));
    }
    Ok(false)
}

/// Deletes our row; whether it was live. PostgreSQL notifies `channel` with `payload` when a
/// row went.
pub(crate) async fn delete(
    conn: &mut Conn,
    (sql, rec_delete): (&SemSql, &str),
    ids: (&str, &str),
    channel: &str,
    payload: &str,
) -> Db<bool> {
    let (id, token) = ids;
    if let Conn::Postgres(p) = conn {
        let live: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.delete.as_str()))
            .bind(id)
            .bind(token)
            .bind(channel)
            .bind(payload)
            .fetch_optional(&mut **p)
            .await?;
        return Ok(live == Some(1));
    }
    let sqlite = matches!(conn, Conn::Sqlite(_));
    let (live, any) = (
        AssertSqlSafe(sql.delete.as_str()),
        AssertSqlSafe(sql.delete_any.as_str()),
    );
    on_conn!(conn, |c| {
        let went = sqlx::query(live)
            .bind(id)
            .bind(token)
            .execute(&mut *c)
            .await?
            .rows_affected();
        if went == 0 {
            // An expired row of ours, if any, goes too.
            sqlx::query(any)
                .bind(id)
                .bind(token)
                .execute(&mut *c)
                .await?;
        }
        if sqlite {
            // MySQL deleted the record with the row; SQLite is in-process, a second
            // statement costs no round trip.
            let rec_id = format!("s:{id}");
            let q = AssertSqlSafe(rec_delete);
            sqlx::query(q).bind(rec_id).bind(token).execute(c).await?;
        }
        Ok(went > 0)
    })
}

/// The live holders (each with its record where it has one) and the limit they use (`None`
/// when nobody holds).
pub(crate) async fn usage(
    conn: &mut Conn,
    sql: &SemSql,
    id: &str,
) -> Db<(Vec<(Holder, Option<HolderRecord>)>, Option<u32>)> {
    type Found = (String, i64, Option<i64>, i64, Option<String>, Option<i64>);
    let text = AssertSqlSafe(sql.usage.as_str());
    let rows: Vec<Found> = on_conn!(conn, |c| sqlx::query_as(text).bind(id).fetch_all(c).await?);
    let limit = rows.first().map(|r| limit_of(r.3));
    let holders = rows
        .into_iter()
        .map(|(t, n, left, _, record, at)| (holder((t, n, left)), record_of(record, at, None)))
        .collect();
    Ok((holders, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(token: &str, permits: u32) -> Holder {
        Holder {
            token: token.to_owned(),
            permits,
            left_ms: 1000,
        }
    }

    #[test]
    fn the_rule_counts_and_binds_the_stored_limit() {
        let p = Permits::new(3, 2).unwrap();
        assert_eq!(rule(3, &[], "a", p), Rule::Take { set_limit: false });
        assert_eq!(rule(5, &[], "a", p), Rule::Take { set_limit: true });
        assert_eq!(
            rule(3, &[h("b", 1)], "a", p),
            Rule::Take { set_limit: false }
        );
        assert_eq!(rule(3, &[h("b", 2)], "a", p), Rule::Full);
        assert_eq!(rule(4, &[h("b", 1)], "a", p), Rule::Mismatch);
        assert_eq!(rule(3, &[h("a", 2), h("b", 1)], "a", p), Rule::Resave);
        assert_eq!(rule(3, &[h("a", 1)], "a", p), Rule::CountChanged(1));
    }
}
