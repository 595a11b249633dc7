//! The holders' records (`<table>_holder`, see `holder_sql`): written with each acquisition,
//! read beside the rows they describe, and the store's listing.

use std::time::{Duration, UNIX_EPOCH};

use sqlx::AssertSqlSafe;

use super::holder_sql::HolderSql;
use super::queries::{Conn, on_conn};
use crate::meta::HolderRecord;

type Db<T> = Result<T, sqlx::Error>;

/// A holder's record as an acquiring statement writes it.
pub(crate) struct Rec<'a> {
    pub(crate) sql: &'a HolderSql,
    /// The resource's name (the lock table keeps only its hash).
    pub(crate) resource: &'a str,
    /// The holder's record (its time is replaced by the database's).
    pub(crate) record: &'a HolderRecord,
    /// MySQL: a re-save writes the record again (its metadata changed since it was written).
    pub(crate) resave: bool,
}

impl Rec<'_> {
    /// The record as stored.
    pub(crate) fn text(&self) -> String {
        self.record.encode()
    }

    /// Writes the record of (`id`, `token`); `new` resets its acquisition time.
    pub(crate) async fn upsert(&self, conn: &mut Conn, ids: (&str, &str), new: bool) -> Db<()> {
        on_conn!(conn, |c| upsert_record!(self, c, ids, new, None))
    }
}

/// Writes `$rec`'s record of `$ids` on one driver's connection or transaction `$on`; `$new`
/// resets its acquisition time, `$fence` is the acquisition's fencing token where the caller
/// knows it. A macro: the same text for every driver, without spelling out sqlx's bounds.
macro_rules! upsert_record {
    ($rec:expr, $on:expr, $ids:expr, $new:expr, $fence:expr) => {{
        let rec: &$crate::store::sql::records::Rec<'_> = $rec;
        let (id, token): (&str, &str) = $ids;
        let text = rec.record.clone().with_fencing_token($fence).encode();
        sqlx::query(sqlx::AssertSqlSafe(rec.sql.upsert.as_str()))
            .bind(id)
            .bind(token)
            .bind(rec.resource)
            .bind(text)
            .bind(i64::from($new))
            .execute($on)
            .await
            .map(|_| ())
    }};
}
pub(crate) use upsert_record;

/// The record a read found: its text, with the acquisition time the database gave it and, for
/// a lock, the resource's fencing counter (the token of its current holder's acquisition: only
/// our acquisitions advance it, and only ours have records). `None` without a record of ours.
pub(crate) fn record_of(
    record: Option<String>,
    at_ms: Option<i64>,
    fence: Option<i64>,
) -> Option<HolderRecord> {
    let mut r = HolderRecord::decode(record?.as_bytes())?;
    if let Some(at) = at_ms.and_then(|ms| u64::try_from(ms).ok()) {
        r.acquired_at = UNIX_EPOCH + Duration::from_millis(at);
    }
    if let Some(n) = fence.and_then(|n| u64::try_from(n).ok()) {
        r.fencing_token = Some(n);
    }
    Some(r)
}

/// A live lock holder under the prefix, as `list` found it.
pub(crate) struct LockRow {
    pub(crate) resource: String,
    pub(crate) token: String,
    pub(crate) left_ms: i64,
    pub(crate) record: Option<HolderRecord>,
}

/// A live semaphore holder under the prefix.
pub(crate) struct PermitRow {
    pub(crate) resource: String,
    pub(crate) token: String,
    pub(crate) permits: u32,
    pub(crate) left_ms: i64,
    pub(crate) record: Option<HolderRecord>,
    pub(crate) limit: u32,
}

/// The live lock holders named by our records whose names match `pattern`.
pub(crate) async fn list_locks(
    conn: &mut Conn,
    sql: &HolderSql,
    pattern: &str,
) -> Db<Vec<LockRow>> {
    type Found = (String, String, Option<i64>, String, i64, Option<i64>);
    let q = AssertSqlSafe(sql.list_locks.as_str());
    let rows: Vec<Found> = on_conn!(conn, |c| sqlx::query_as(q)
        .bind(pattern)
        .fetch_all(c)
        .await?);
    Ok(rows
        .into_iter()
        .map(|(resource, token, left, record, at, n)| LockRow {
            resource,
            token,
            left_ms: left.unwrap_or(0).max(0),
            record: record_of(Some(record), Some(at), n),
        })
        .collect())
}

/// The live lock rows without a record of ours (every one when `all`, else only `id`'s):
/// `key_id`, token, milliseconds left.
pub(crate) async fn list_unnamed(
    conn: &mut Conn,
    sql: &HolderSql,
    all: bool,
    id: &str,
) -> Db<Vec<(String, String, i64)>> {
    let q = AssertSqlSafe(sql.list_unnamed.as_str());
    let all = i64::from(all);
    let rows: Vec<(String, String, Option<i64>)> = on_conn!(conn, |c| {
        sqlx::query_as(q).bind(all).bind(id).fetch_all(c).await?
    });
    Ok(rows
        .into_iter()
        .map(|(k, t, left)| (k, t, left.unwrap_or(0).max(0)))
        .collect())
}

/// The live semaphore holders named by our records whose names match `pattern`.
pub(crate) async fn list_permits(
    conn: &mut Conn,
    sql: &HolderSql,
    pattern: &str,
) -> Db<Vec<PermitRow>> {
    type Found = (String, String, i64, Option<i64>, String, i64, i64);
    let q = AssertSqlSafe(sql.list_permits.as_str());
    let rows: Vec<Found> = on_conn!(conn, |c| sqlx::query_as(q)
        .bind(pattern)
        .fetch_all(c)
        .await?);
    Ok(rows
        .into_iter()
        .map(
            |(resource, token, permits, left, record, at, limit)| PermitRow {
                resource,
                token,
                permits: u32::try_from(permits.max(0)).unwrap_or(u32::MAX),
                left_ms: left.unwrap_or(0).max(0),
                record: record_of(Some(record), Some(at), None),
                limit: u32::try_from(limit.max(0)).unwrap_or(u32::MAX),
            },
        )
        .collect())
}
