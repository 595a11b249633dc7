//! The background sweep of expired rows, tickets and records.

use std::time::Instant;

use tokio::sync::watch;

use super::ops::take;
use super::queries::{self, Conn};
use super::{SqlStore, lock};
use crate::error::Error;

type Db<T> = std::result::Result<T, sqlx::Error>;

impl SqlStore {
    /// Sweeps expired rows in the background, at most once per sweep interval.
    pub(super) fn maybe_sweep(&self) {
        let now = Instant::now();
        {
            let mut swept = lock(&self.inner.swept);
            if swept.is_some_and(|t| now.duration_since(t) < self.inner.sweep_every) {
                return;
            }
            *swept = Some(now);
        }
        let Ok(pool) = self.inner.pools.get() else {
            return;
        };
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let limit = inner.statement_timeout;
            let sweep = async {
                let (_bound, mut bound) = watch::channel(());
                let mut taken = take(&pool, false, &mut bound, &inner).await?;
                let c = &mut taken.conn;
                let rows = prune(c, &inner.sql.prune).await;
                let counters = prune(c, &inner.sql.prune_fence).await;
                // Records of holders whose rows went (released elsewhere, taken over, swept).
                let records = prune(c, &inner.rec.prune).await;
                // Tickets of waiters gone long ago (a ticket expires on its own; this only
                // keeps the table small).
                if let Some(q) = &inner.queue {
                    let _ = prune(c, &q.prune).await;
                }
                // The semaphores' expired holders, once a semaphore was used here.
                let permits = if inner.sem_schema.initialized() {
                    let rows = prune(c, &inner.sem.prune).await;
                    let recs = prune(c, &inner.rec.prune_permits).await;
                    rows.and_then(|r| recs.map(|s| Some((r, s))))
                } else {
                    Ok(None)
                };
                taken.answered =
                    rows.is_ok() && counters.is_ok() && records.is_ok() && permits.is_ok();
                Ok::<_, Error>((rows, counters, records, permits))
            };
            let swept = tokio::time::timeout(limit * 2, sweep).await;
            tracing::debug!(target: crate::logging::TARGET, table = %inner.table,
                ?swept, "swept expired rows");
        });
    }
}

/// Runs one of the sweep's deletes; the rows it deleted.
///
/// On MySQL it runs at READ COMMITTED (`SET TRANSACTION` applies to the next statement only):
/// under REPEATABLE READ a `DELETE … WHERE NOT EXISTS (SELECT … FROM <other table>)` locks the
/// rows it scans and reads the other table with shared locks, the reverse of the order a
/// release takes them in (the row, then its record): the deadlock stress test saw InnoDB break
/// two such deadlocks (the records' sweep against a permit's release). At READ COMMITTED the
/// other table is read without locks, and scanned rows that do not match are let go.
async fn prune(conn: &mut Conn, text: &str) -> Db<u64> {
    if matches!(conn, Conn::MySql(_)) {
        queries::execute(conn, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED").await?;
    }
    queries::execute(conn, text).await
}
