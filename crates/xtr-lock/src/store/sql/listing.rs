//! The store's listing and its observers.
//!
//! The lock table keys rows by the SHA-256 of the resource, so a name is known only from our
//! record of the holder (`<table>_holder`). Rows without one (Symfony's holders, ours from
//! before the records) are listed when the prefix names them exactly (the hash matches), and
//! all of them, as `sha256:<key_id>`, when the prefix is empty.

use std::collections::BTreeMap;
use std::time::Duration;

use super::dialect::Flavor;
use super::holder_sql::HolderSql;
use super::holder_sql::prefix_pattern;
use super::ops::Run;
use super::queries::{Conn, on_conn};
use super::records::record_of;
use super::sem_sql::perm_table;
use super::{SqlStore, changes_id, key_id, queries};
use crate::error::Result;
use crate::key::Mode;
use crate::meta::HolderRecord;
use crate::store::{HolderInfo, Listing, Watcher};
use sqlx::AssertSqlSafe;

/// The name a row without a record of ours is listed under, when the prefix does not name it.
const UNNAMED: &str = "sha256:";

fn left(ms: i64) -> Option<Duration> {
    Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

impl SqlStore {
    /// One connection, three reads: our named lock holders, the rows we cannot name, the
    /// semaphores' holders (once the semaphores' tables exist).
    pub(super) async fn listing(&self, prefix: &str) -> Result<Vec<Listing>> {
        let pattern = prefix_pattern(self.inner.flavor, prefix);
        let (all, id) = (prefix.is_empty(), key_id(prefix));
        let (locks, unnamed, permits) = {
            let id = id.clone();
            self.run(prefix, Run::plain(&self.inner), move |conn, inner| {
                let (pattern, id) = (pattern.clone(), id.clone());
                Box::pin(async move {
                    let locks = list_locks(conn, &inner.rec, &pattern).await?;
                    let unnamed = list_unnamed(conn, &inner.rec, all, &id).await?;
                    let sems = inner.sem_schema.initialized()
                        || !super::schema::table_columns(
                            conn,
                            &inner.sql,
                            &perm_table(&inner.table),
                        )
                        .await?
                        .is_empty();
                    let permits = match sems {
                        true => list_permits(conn, &inner.rec, &pattern).await?,
                        false => Vec::new(),
                    };
                    Ok((locks, unnamed, permits))
                })
            })
            .await?
        };
        let mut out: Vec<Listing> = locks.into_iter().map(lock_listing).collect();
        out.extend(unnamed.into_iter().map(|(kid, token, ms)| {
            let name = match kid == id {
                true => prefix.to_owned(),
                false => format!("{UNNAMED}{kid}"),
            };
            let holder = HolderInfo::new(Mode::Write, None, left(ms)).with_token(&token);
            Listing::lock(name, vec![holder])
        }));
        out.extend(semaphore_listings(permits));
        Ok(out)
    }

    /// Woken by this store's acquisitions and releases of `resource`, and on PostgreSQL by
    /// every release of this library's holders (the releasing statement notifies). An
    /// acquisition elsewhere does not notify (a `NOTIFY` per acquisition would serialise every
    /// acquiring commit on the server's notification queue), nor does a Symfony release: best
    /// effort, so the observer polls as well.
    pub(super) async fn observer(&self, resource: &str) -> Watcher {
        let id = key_id(resource);
        let (mut released, mut acquired) = (
            self.inner.wakers.subscribe(&id),
            self.inner.wakers.subscribe(&changes_id(&id)),
        );
        if self.inner.flavor == Flavor::Postgres {
            self.ensure_listener().await;
        }
        Watcher::best_effort(async move {
            // An error means the store is gone: wake (spuriously) rather than hang.
            tokio::select! {
                _ = released.changed() => {}
                _ = acquired.changed() => {}
            }
        })
    }

    pub(super) async fn who(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let id = key_id(resource);
        let rows = self
            .run(resource, Run::plain(&self.inner), move |conn, inner| {
                let id = id.clone();
                Box::pin(async move { queries::holders(conn, &inner.sql, &id).await })
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(token, left, record)| {
                let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
                HolderInfo::new(Mode::Write, None, Some(left))
                    .with_token(&token)
                    .with_record(record)
            })
            .collect())
    }

    pub(super) async fn counter(&self, resource: &str) -> Result<u64> {
        let id = key_id(resource);
        self.run(resource, Run::plain(&self.inner), move |conn, inner| {
            let id = id.clone();
            Box::pin(async move { queries::fence_counter(conn, &inner.sql, &id).await })
        })
        .await
    }
}

fn lock_listing(row: LockRow) -> Listing {
    let holder = HolderInfo::new(Mode::Write, None, left(row.left_ms))
        .with_token(&row.token)
        .with_record(row.record);
    Listing::lock(row.resource, vec![holder])
}

/// The semaphores' holders, one listing per semaphore.
fn semaphore_listings(permits: Vec<PermitRow>) -> Vec<Listing> {
    let mut by_name: BTreeMap<String, (u32, Vec<HolderInfo>)> = BTreeMap::new();
    for p in permits {
        let holder = HolderInfo::new(Mode::Write, None, left(p.left_ms))
            .with_token(&p.token)
            .with_permits(p.permits)
            .with_record(p.record);
        let entry = by_name.entry(p.resource).or_insert((p.limit, Vec::new()));
        entry.1.push(holder);
    }
    by_name
        .into_iter()
        .map(|(name, (limit, holders))| Listing::semaphore(name, limit, holders))
        .collect()
}

type Db<T> = std::result::Result<T, sqlx::Error>;

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
