//! The table store's counting semaphores: holder rows in `<table>_perm`, admitted one at a
//! time under the semaphore's row in `<table>_sem` (see `sem_sql`), apart from the lock table.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::dialect::Flavor;
use super::ops::Run;
use super::queue;
use super::records::{Rec, stored_name};
use super::sem_queries::{self, Admitted};
use super::{
    HolderState, KIND, SqlStore, acquired, announces, check_expiry, key_id, wake_id, whole_seconds,
};
use crate::error::{LostReason, Result};
use crate::key::{Key, Mode};
use crate::meta::HolderRecord;
use crate::permits::Permits;
use crate::store::{Conflict, HolderInfo, Holding, Saved, Usage};

/// The lifetime a row of `secs` whole seconds certainly keeps (it may be taken 1 s early).
fn kept(secs: i32) -> Duration {
    Duration::from_secs(u64::try_from(secs - 1).unwrap_or(0))
}

/// What our row means for its holder.
fn holding(live: Option<bool>) -> Holding {
    match live {
        Some(true) => Holding::Held(Mode::Write),
        Some(false) => Holding::NotHeld(LostReason::Expired),
        None => Holding::NotHeld(LostReason::Removed),
    }
}

impl SqlStore {
    /// One transaction: lock (or make) the semaphore's row, delete its expired holders, count
    /// the live ones, and add this holder if its permits fit under the stored limit.
    pub(super) async fn sem_save(
        &self,
        key: &Key,
        permits: Permits,
        ttl: Option<Duration>,
    ) -> Result<Saved> {
        let secs = self.ttl_seconds(key, ttl)?;
        let state = self.begin_save(key, kept(secs).max(Duration::from_secs(1)))?;
        let (id, token) = (key_id(key.resource()), key.token(KIND));
        let how = Run::keeping(&self.inner, key)
            .unsent(state.unsent.clone())
            .semaphores();
        let record = Arc::new((stored_name(key.resource()), HolderRecord::now(key)));
        let (admitted, sent) = {
            let state = state.clone();
            let tried = Arc::new(AtomicBool::new(false));
            self.run(key.resource(), how, move |conn, inner| {
                let (id, token, state) = (id.clone(), token.clone(), state.clone());
                let record = record.clone();
                let rerun = tried.swap(true, Ordering::AcqRel);
                Box::pin(async move {
                    let rec = Rec {
                        sql: &inner.rec,
                        resource: &record.0,
                        record: &record.1,
                        resave: true,
                    };
                    // Our row certainly live as the statement goes out (and this is no rerun
                    // after a lost answer): finding it is a re-save, with no new fencing token.
                    let sent = Instant::now();
                    let known = !rerun && state.live_at(sent);
                    let ids = (id.as_str(), token.as_str());
                    let place = queue::place_of(inner, &state);
                    let fair = inner.queue.as_ref().zip(place);
                    let admitted = sem_queries::admit(
                        conn,
                        (&inner.sem, &rec, fair),
                        ids,
                        permits,
                        i64::from(secs),
                        known,
                    )
                    .await?;
                    if place.is_some_and(|p| p < super::queue_sql::NEWCOMER)
                        && matches!(admitted, Admitted::Full { .. })
                    {
                        let q_id = format!("s:{id}");
                        queue::left_meanwhile(conn, inner, &state, (&q_id, &token)).await?;
                    }
                    Ok((admitted, sent))
                })
            })
            .await?
        };
        match admitted {
            Admitted::Taken { fence } => {
                // No longer waiting: the admission took its ticket out.
                *crate::mutex::lock(&state.waiting) = None;
                state.confirm(sent + kept(secs));
                self.maybe_sweep();
                check_expiry(self, key).await?;
                Ok(acquired(fence))
            }
            Admitted::Full { holders } => Ok(self.full(&state, &holders)),
            Admitted::CountChanged { held } => {
                Err(permits.count_changed(key.resource(), held).with_store(self))
            }
            Admitted::Mismatch { stored } => Err(permits
                .limit_mismatch(key.resource(), stored)
                .with_store(self)),
        }
    }

    /// Refused, every permit taken by `holders`: retry when the first holder's row can be
    /// taken, and wait without polling while every holder announces its release through
    /// PostgreSQL's notifications.
    fn full(&self, state: &HolderState, holders: &[sem_queries::Holder]) -> Saved {
        let via_listener = self.inner.flavor == Flavor::Postgres
            && !holders.is_empty()
            && holders.iter().all(|h| announces(&h.token));
        state.announced.store(via_listener, Ordering::Release);
        state.via_listener.store(via_listener, Ordering::Release);
        let left = holders.iter().map(|h| h.left_ms).min().unwrap_or(0).max(1);
        let after = Duration::from_millis(u64::try_from(left).unwrap_or(1) + 5);
        Saved::Conflict(Conflict::new().with_retry_after(after))
    }

    /// One statement that extends our own live row; never inserts, never revives an expired
    /// row.
    pub(super) async fn sem_put_off(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        let secs = whole_seconds(ttl);
        if secs < 2 {
            // Not keepable in whole seconds taken up to 1 s early: it ends at once.
            key.reduce_lifetime(Duration::ZERO);
            check_expiry(self, key).await?;
        }
        key.reduce_lifetime(kept(secs).max(Duration::from_secs(1)));
        let (id, token) = (key_id(key.resource()), key.token(KIND));
        let sent = Instant::now();
        let extended = {
            let (id, token) = (id.clone(), token.clone());
            let how = Run::keeping(&self.inner, key).semaphores();
            self.run(key.resource(), how, move |conn, inner| {
                let (id, token) = (id.clone(), token.clone());
                Box::pin(async move {
                    sem_queries::refresh(conn, &inner.sem, &id, &token, i64::from(secs)).await
                })
            })
            .await?
        };
        if extended {
            key.handle::<HolderState>(self.inner.owner)
                .confirm(sent + kept(secs));
            check_expiry(self, key).await?;
            return Ok(Holding::Held(Mode::Write));
        }
        self.sem_own(key, id, token).await
    }

    /// Our row: held, expired or gone.
    pub(super) async fn sem_check(&self, key: &Key) -> Result<Holding> {
        if !key.has_token(KIND) {
            return Ok(Holding::NotHeld(LostReason::Removed));
        }
        let (id, token) = (key_id(key.resource()), key.token(KIND));
        self.sem_own(key, id, token).await
    }

    async fn sem_own(&self, key: &Key, id: String, token: String) -> Result<Holding> {
        if self.inner.pools.file_missing() {
            return Ok(Holding::NotHeld(LostReason::Removed));
        }
        let how = Run::plain(&self.inner).semaphores();
        let live = self
            .run(key.resource(), how, move |conn, inner| {
                let (id, token) = (id.clone(), token.clone());
                Box::pin(async move { sem_queries::own(conn, &inner.sem, &id, &token).await })
            })
            .await?;
        Ok(holding(live))
    }

    /// Deletes our row (PostgreSQL notifies in the same statement) and wakes this store's
    /// waiters; `true` only if our live row went.
    pub(super) async fn sem_remove(&self, key: &Key) -> Result<bool> {
        if !key.has_token(KIND) {
            return Ok(false);
        }
        let unsent = key
            .handle::<HolderState>(self.inner.owner)
            .unsent
            .load(Ordering::Acquire);
        if unsent || self.inner.pools.file_missing() {
            // Nothing of this holder ever reached the database, or there is no database.
            return Ok(false);
        }
        let (id, token, wake) = (key_id(key.resource()), key.token(KIND), wake_id(key));
        let live = {
            let wake = wake.clone();
            let how = Run::release(&self.inner).semaphores();
            self.run(key.resource(), how, move |conn, inner| {
                let (id, token, wake) = (id.clone(), token.clone(), wake.clone());
                Box::pin(async move {
                    let ids = (id.as_str(), token.as_str());
                    let sql = (&inner.sem, inner.rec.delete.as_str());
                    sem_queries::delete(conn, sql, ids, &inner.channel, &wake).await
                })
            })
            .await?
        };
        self.inner.wakers.notify(&wake);
        Ok(live)
    }

    /// The live holders, with their permits and remaining lifetimes, and the stored limit.
    pub(super) async fn sem_usage(&self, key: &Key) -> Result<Usage> {
        let id = key_id(key.resource());
        let how = Run::plain(&self.inner).semaphores();
        let (holders, limit) = self
            .run(key.resource(), how, move |conn, inner| {
                let id = id.clone();
                Box::pin(async move { sem_queries::usage(conn, &inner.sem, &id).await })
            })
            .await?;
        let used = holders.iter().map(|(h, _)| h.permits).sum();
        let holders = holders
            .into_iter()
            .map(|(h, record)| {
                let left = Duration::from_millis(u64::try_from(h.left_ms).unwrap_or(0));
                HolderInfo::new(Mode::Write, None, Some(left))
                    .with_token(&h.token)
                    .with_permits(h.permits)
                    .with_record(record)
            })
            .collect();
        Ok(Usage {
            used,
            limit,
            holders,
        })
    }
}
