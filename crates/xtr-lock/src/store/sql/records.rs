//! The holders' records (`<table>_holder`, see `holder_sql`): written with each acquisition,
//! read beside the rows they describe, and the store's listing.

use std::time::{Duration, UNIX_EPOCH};

use super::holder_sql::HolderSql;
use crate::meta::HolderRecord;

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

/// A resource's name as its record keeps it: PostgreSQL's text cannot hold a NUL, so a NUL is
/// kept (and listed) as U+FFFD on every database.
pub(crate) fn stored_name(resource: &str) -> String {
    resource.replace('\0', "\u{FFFD}")
}
