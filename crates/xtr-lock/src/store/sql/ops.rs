//! The store's operations, bounded by the statement timeout; errors named after what failed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{
    HolderState, Inner, KIND, SqlStore, acquired, announces, check_expiry, holding, key_id, lock,
    notify, queries, refused, schema, whole_seconds,
};
use crate::clock::BoxFuture;
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::store::{HolderInfo, Holding, Saved, Watcher};

use super::dialect::Flavor;
use super::queries::Pool;

type Db<T> = std::result::Result<T, sqlx::Error>;

impl SqlStore {
    /// Runs `op` on the pool, after the table check, within the statement timeout.
    ///
    /// A statement given up on at the timeout is not dropped: it finishes after the lock's
    /// store call, before the holder's next one (`crate::serial::within`), so a clean-up delete
    /// never runs before the save it cleans up after.
    ///
    /// Pooled connections are not pinged before use (that would double every round trip): a
    /// connection found broken (the server restarted, a proxy dropped it) fails its statement
    /// with an I/O error, and the operation runs once more on a fresh connection. Every
    /// operation may run twice: a re-save of our own row, a refresh, a delete and a read are
    /// idempotent, and a second fencing draw only makes the token larger.
    async fn run<T, F>(&self, resource: &str, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(Pool, Arc<Inner>) -> BoxFuture<'static, Db<T>> + Send + Sync + 'static,
    {
        let pool = self.pool().await.map_err(|e| e.with_resource(resource))?;
        let inner = self.inner.clone();
        let limit = inner.statement_timeout;
        let work = async move {
            inner
                .schema
                .get_or_try_init(|| async {
                    schema::ensure(&inner, &pool, inner.create_table)
                        .await
                        .map(|_| ())
                })
                .await?;
            match op(pool.clone(), inner.clone()).await {
                Err(e) if broken(&e) => op(pool, inner.clone()).await,
                done => done,
            }
            .map_err(|e| map_error(e, &inner))
        };
        let done = crate::serial::within(limit, work).await.unwrap_or_else(|| {
            Err(Error::storage(format!(
                "the database did not answer within {limit:?} (the statement timeout)"
            ))
            .temporary())
        });
        done.map_err(|e| e.with_resource(resource).with_store(self))
    }

    pub(super) async fn save_write(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        let secs = self.ttl_seconds(key, ttl)?;
        // The row may be taken up to 1 s early (whole seconds): the local deadline is the ttl
        // less that, set before the round trip.
        key.reduce_lifetime(Duration::from_secs(u64::try_from(secs - 1).unwrap_or(1)));
        if key.is_expired() {
            return Err(Error::expired(key.resource()).with_store(self));
        }
        let (id, token) = (key_id(key.resource()), key.token(KIND));
        let saved = {
            let (id, token) = (id.clone(), token.clone());
            self.run(key.resource(), move |pool, inner| {
                let (id, token) = (id.clone(), token.clone());
                Box::pin(async move { queries::save(&pool, &inner.sql, &id, &token, secs).await })
            })
            .await?
        };
        match saved {
            queries::Saved::Acquired { fence } => {
                lock(&self.inner.held).insert(id, token);
                self.maybe_sweep();
                check_expiry(self, key).await?;
                Ok(acquired(fence))
            }
            queries::Saved::Conflict { holder } => {
                // Refused: whatever this holder held here is gone.
                self.forget(&id, &token);
                let state = key.handle::<HolderState>(self.inner.owner);
                let here = holder
                    .as_ref()
                    .is_some_and(|h| lock(&self.inner.held).get(&id) == Some(&h.token));
                let via_listener = !here
                    && self.inner.flavor == Flavor::Postgres
                    && holder.as_ref().is_some_and(|h| announces(&h.token));
                state
                    .announced
                    .store(here || via_listener, Ordering::Release);
                state.via_listener.store(via_listener, Ordering::Release);
                Ok(refused(holder.as_ref()))
            }
        }
    }

    pub(super) async fn put_off(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        let secs = whole_seconds(ttl);
        if secs < 2 {
            // Not keepable in whole seconds taken up to 1 s early: it ends at once.
            key.reduce_lifetime(Duration::ZERO);
            check_expiry(self, key).await?;
        }
        key.reduce_lifetime(Duration::from_secs(u64::try_from(secs - 1).unwrap_or(1)));
        let (id, token) = (key_id(key.resource()), key.token(KIND));
        let extended = {
            let (id, token) = (id.clone(), token.clone());
            self.run(key.resource(), move |pool, inner| {
                let (id, token) = (id.clone(), token.clone());
                Box::pin(
                    async move { queries::refresh(&pool, &inner.sql, &id, &token, secs).await },
                )
            })
            .await?
        };
        if extended {
            check_expiry(self, key).await?;
            return Ok(Holding::Held(Mode::Write));
        }
        let row = self.read(key, id.clone()).await?;
        let found = holding(row.as_ref(), &token);
        if matches!(found, Holding::NotHeld(_)) {
            self.forget(&id, &token);
        }
        Ok(found)
    }

    async fn read(&self, key: &Key, id: String) -> Result<Option<queries::Row>> {
        self.run(key.resource(), move |pool, inner| {
            let id = id.clone();
            Box::pin(async move { queries::read(&pool, &inner.sql, &id).await })
        })
        .await
    }

    pub(super) async fn remove(&self, key: &Key) -> Result<bool> {
        if !key.has_token(KIND) {
            return Ok(false);
        }
        let (id, token) = (key_id(key.resource()), key.token(KIND));
        let live = {
            let (id, token) = (id.clone(), token.clone());
            self.run(key.resource(), move |pool, inner| {
                let (id, token) = (id.clone(), token.clone());
                Box::pin(async move {
                    queries::delete(&pool, &inner.sql, &id, &token, &inner.channel).await
                })
            })
            .await?
        };
        self.forget(&id, &token);
        self.inner.wakers.notify(&id);
        Ok(live)
    }

    /// Forgets `token` as this store's holder of `id` (released, lost or taken over), so the
    /// map of holders keeps only the live ones.
    fn forget(&self, id: &str, token: &str) {
        let mut held = lock(&self.inner.held);
        if held.get(id).is_some_and(|t| t == token) {
            held.remove(id);
        }
    }

    pub(super) async fn check(&self, key: &Key) -> Result<Holding> {
        if !key.has_token(KIND) {
            return Ok(Holding::NotHeld(crate::error::LostReason::Removed));
        }
        let (id, token) = (key_id(key.resource()), key.token(KIND));
        let row = self.read(key, id.clone()).await?;
        let found = holding(row.as_ref(), &token);
        if matches!(found, Holding::NotHeld(_)) {
            self.forget(&id, &token);
        }
        Ok(found)
    }

    pub(super) async fn watcher(&self, key: &Key) -> Watcher {
        let id = key_id(key.resource());
        let mut rx = self.inner.wakers.subscribe(&id);
        if self.inner.flavor == Flavor::Postgres {
            self.ensure_listener().await;
        }
        let state = key.handle::<HolderState>(self.inner.owner);
        let (announced, via) = (state.announced.clone(), state.via_listener.clone());
        let wakers = self.inner.wakers.clone();
        Watcher::with_coverage(
            async move {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            },
            move || {
                announced.load(Ordering::Acquire)
                    && (!via.load(Ordering::Acquire) || wakers.listening())
            },
        )
    }

    /// Starts the PostgreSQL listener unless it runs; the first time, waits (briefly) until it
    /// listens, so the first waiters need not poll.
    async fn ensure_listener(&self) {
        let started = {
            let mut task = lock(&self.inner.listener);
            if task.as_ref().is_some_and(|t| !t.is_finished()) {
                false
            } else {
                let Ok(Pool::Postgres(pool)) = self.inner.pools.get() else {
                    return;
                };
                *task = Some(tokio::spawn(notify::listen(
                    pool,
                    self.inner.channel.clone(),
                    self.inner.wakers.clone(),
                )));
                true
            }
        };
        if started {
            self.inner
                .wakers
                .until_listening(Duration::from_secs(1))
                .await;
        }
    }

    pub(super) async fn who(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let id = key_id(resource);
        let rows = self
            .run(resource, move |pool, inner| {
                let id = id.clone();
                Box::pin(async move { queries::holders(&pool, &inner.sql, &id).await })
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|(token, left)| {
                let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
                HolderInfo::new(Mode::Write, None, Some(left)).with_token(&token)
            })
            .collect())
    }

    pub(super) async fn counter(&self, resource: &str) -> Result<u64> {
        let id = key_id(resource);
        self.run(resource, move |pool, inner| {
            let id = id.clone();
            Box::pin(async move { queries::fence_counter(&pool, &inner.sql, &id).await })
        })
        .await
    }

    /// Sweeps expired rows in the background, at most once per sweep interval.
    fn maybe_sweep(&self) {
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
            let rows = tokio::time::timeout(limit, queries::execute(&pool, &inner.sql.prune)).await;
            let counters =
                tokio::time::timeout(limit, queries::execute(&pool, &inner.sql.prune_fence)).await;
            tracing::debug!(target: crate::logging::TARGET, table = %inner.table,
                rows = ?rows, counters = ?counters, "swept expired rows");
        });
    }

    pub(super) fn db_error(&self, e: sqlx::Error, resource: Option<&str>) -> Error {
        let err = map_error(e, &self.inner).with_store(self);
        match resource {
            Some(r) => err.with_resource(r),
            None => err,
        }
    }
}

/// Whether `e` says the connection was broken (so the statement can go again on another).
fn broken(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_) | sqlx::Error::Protocol(_))
}

/// SQLSTATEs (and SQLite codes) of failures that may pass: serialization failures, deadlocks,
/// lock timeouts, cancelled statements, a server shutting down or starting.
const PASSING: &[&str] = &[
    "40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "08006", "08001", "HY000", "5",
    "6", "261", "517",
];

/// A database failure as this library's error, naming what failed without the driver's noise.
pub(super) fn map_error(e: sqlx::Error, inner: &Inner) -> Error {
    let table = &inner.table;
    let out = match &e {
        sqlx::Error::PoolTimedOut => {
            Error::storage("cannot reach the database: no connection within the connect timeout")
                .temporary()
        }
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => {
            Error::storage(format!("cannot reach the database: {e}")).temporary()
        }
        sqlx::Error::WorkerCrashed => {
            Error::storage("the database's connection worker stopped").temporary()
        }
        sqlx::Error::PoolClosed => Error::storage("the store's connections were closed"),
        sqlx::Error::Database(d) => {
            let code = d.code().map(|c| c.into_owned()).unwrap_or_default();
            let message = d.message().to_owned();
            if code == "42P01" || code == "42S02" || message.contains("no such table") {
                Error::storage(format!(
                    "the lock table {table} (or its fencing table {table}_fence) does not exist: \
                     make it with `xtr-lock migrate --store <DSN>` (or add ?create_table=true \
                     to the DSN)"
                ))
            } else {
                let err = Error::storage(format!("the database refused: {message}"));
                if PASSING.contains(&code.as_str()) {
                    err.temporary()
                } else {
                    err
                }
            }
        }
        _ => Error::storage(format!("the database failed: {e}")),
    };
    out.with_source(e)
}
