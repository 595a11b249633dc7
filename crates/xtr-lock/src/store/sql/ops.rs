//! The store's operations, bounded by the statement timeout; errors named after what failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::records::{Rec, stored_name};
use super::{
    HolderState, Inner, KIND, SqlStore, acquired, announces, changes_id, check_expiry, holding,
    key_id, lock, notify, queries, queue, queue_mysql, refused, schema, wake_id, whole_seconds,
};
use crate::meta::HolderRecord;
use tokio::sync::watch;

use crate::clock::BoxFuture;
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::store::{Conflict, Holding, Saved, Watcher};

use super::dialect::Flavor;
use super::errors::{broken, map_error, rolled_back};
use super::queries::{Conn, Pool};

type Db<T> = std::result::Result<T, sqlx::Error>;

/// How one operation runs.
pub(super) struct Run {
    /// Its bound: the statement timeout, or less (the lifetime a save or renewal can still
    /// keep: an answer after it is of no use).
    limit: Duration,
    /// Given up while no connection is had yet, once its caller stopped waiting (a `-w`
    /// deadline, a dropped acquire): nothing was sent, so nothing needs undoing. A release
    /// never is.
    abandon: bool,
    /// Cleared as soon as a connection is had for it (a statement may be sent from then on).
    unsent: Option<Arc<AtomicBool>>,
    /// A semaphore's operation: the semaphores' tables are checked (or made) first.
    semaphores: bool,
}

impl Run {
    pub(super) fn plain(inner: &Inner) -> Run {
        Run {
            limit: inner.statement_timeout,
            abandon: true,
            unsent: None,
            semaphores: false,
        }
    }

    /// Marked as a save's: `unsent` is cleared once a connection is had for it.
    pub(super) fn unsent(self, unsent: Arc<AtomicBool>) -> Run {
        Run {
            unsent: Some(unsent),
            ..self
        }
    }

    /// For a semaphore's operation.
    pub(super) fn semaphores(self) -> Run {
        Run {
            semaphores: true,
            ..self
        }
    }

    pub(super) fn release(inner: &Inner) -> Run {
        Run {
            abandon: false,
            ..Run::plain(inner)
        }
    }

    /// Bounded by what is left of `key`'s lifetime too (at least a moment).
    pub(super) fn keeping(inner: &Inner, key: &Key) -> Run {
        let left = key
            .remaining_lifetime()
            .map_or(inner.statement_timeout, |l| l.max(MIN_LIMIT));
        Run {
            limit: inner.statement_timeout.min(left),
            ..Run::plain(inner)
        }
    }
}

/// How often a transaction the database rolled back (a deadlock, a serialization failure) goes
/// again before its failure is the caller's, all within the operation's bound.
const ROLLBACK_RETRIES: u32 = 8;

/// The pause before the `n`th retry of a rolled-back transaction: a few milliseconds, growing,
/// jittered so that the two transactions of a deadlock do not meet again in step.
fn rollback_pause(n: u32) -> Duration {
    let most = Duration::from_millis(2u64 << n.min(5));
    most.mul_f64(0.5 + rand::random::<f64>() / 2.0)
}

/// The shortest bound of a save or renewal whose lifetime is nearly over.
const MIN_LIMIT: Duration = Duration::from_millis(250);

/// A connection in use: back to the pool once its statements were answered, closed otherwise.
pub(super) struct Taken {
    pub(super) conn: Conn,
    pub(super) answered: bool,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if !self.answered {
            self.conn.discard();
        }
    }
}

/// Takes a connection, unless the caller leaves first (or the operation's bound passes: `bound`
/// closes) when `abandon` allows: nothing has been sent then, and nobody waits for it.
pub(super) async fn take(
    pool: &Pool,
    abandon: bool,
    bound: &mut watch::Receiver<()>,
    inner: &Inner,
) -> Result<Taken> {
    let conn = if abandon {
        tokio::select! {
            biased;
            conn = pool.acquire(true) => conn,
            _ = bound.changed() => {
                return Err(Error::storage(
                    "gave up before reaching the database: its bound passed",
                )
                .temporary());
            }
            () = crate::serial::caller_left() => {
                return Err(Error::storage(
                    "gave up before reaching the database: nobody waits for the answer any more",
                )
                .temporary());
            }
        }
    } else {
        pool.acquire(false).await
    };
    match conn {
        Ok(conn) => Ok(Taken {
            conn,
            answered: false,
        }),
        Err(e) => Err(map_error(e, inner)),
    }
}

impl SqlStore {
    /// Runs `op` on a connection of the pool, after the table check, within `how.limit`.
    ///
    /// A statement given up on at the limit is not dropped: it finishes after the lock's store
    /// call, before the holder's next one (`crate::serial::within`), so a clean-up delete
    /// never runs before the save it cleans up after; its connection is then closed, never
    /// handed back. Waiting for a connection (the server is down, paused or cut off) ends as
    /// soon as the caller stops waiting or the bound passes, unless the operation is a release.
    ///
    /// Pooled connections are not pinged before use (that would double every round trip): a
    /// connection found broken (the server restarted, a proxy dropped it) fails its statement
    /// with an I/O error, and the operation runs once more on a fresh connection. Every
    /// operation may run twice: a re-save of our own row, a refresh, a delete and a read are
    /// idempotent, and a second fencing draw only makes the token larger.
    pub(super) async fn run<T, F>(&self, resource: &str, how: Run, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: for<'c> Fn(&'c mut Conn, &'c Inner) -> BoxFuture<'c, Db<T>> + Send + Sync + 'static,
    {
        let pool = self.pool().await.map_err(|e| e.with_resource(resource))?;
        let inner = self.inner.clone();
        let Run {
            limit,
            abandon,
            unsent,
            semaphores,
        } = how;
        // Dropped when `within` returns: a remainder still waiting for a connection then stops.
        let (within_bound, mut bound) = watch::channel(());
        let work = async move {
            let mut taken = take(&pool, abandon, &mut bound, &inner).await?;
            if let Some(unsent) = &unsent {
                unsent.store(false, Ordering::Release);
            }
            let (c, i) = (&mut taken.conn, &*inner);
            let checked = i
                .schema
                .get_or_try_init(|| async move {
                    schema::ensure(i, c, i.create_table).await.map(|_| ())
                })
                .await;
            let checked = match checked {
                Ok(_) if semaphores => {
                    let c = &mut taken.conn;
                    i.sem_schema
                        .get_or_try_init(|| async move {
                            schema::ensure_semaphores(i, c, i.create_table)
                                .await
                                .map(|_| ())
                        })
                        .await
                }
                checked => checked,
            };
            if let Err(e) = checked {
                taken.answered = true;
                return Err(e);
            }
            let mut done = op(&mut taken.conn, &inner).await;
            let mut rollbacks = 0;
            while done.as_ref().is_err_and(rolled_back) && rollbacks < ROLLBACK_RETRIES {
                // The database undid the whole transaction to break a deadlock (or a
                // serialization conflict): nothing of it happened, and it goes again.
                rollbacks += 1;
                tokio::time::sleep(rollback_pause(rollbacks)).await;
                done = op(&mut taken.conn, &inner).await;
            }
            if done.as_ref().is_err_and(broken) {
                drop(taken);
                taken = take(&pool, abandon, &mut bound, &inner).await?;
                done = op(&mut taken.conn, &inner).await;
            }
            taken.answered = !done.as_ref().is_err_and(broken);
            done.map_err(|e| map_error(e, &inner))
        };
        let done = crate::serial::within(limit, work).await;
        drop(within_bound);
        let done = done.unwrap_or_else(|| {
            Err(Error::storage(format!(
                "the database did not answer within {limit:?} (the statement timeout, or \
                 what was left of the lock's lifetime)"
            ))
            .temporary())
        });
        done.map_err(|e| e.with_resource(resource).with_store(self))
    }

    /// What every save does before its statement: the key's lifetime shortened to `kept`
    /// before the round trip (refused if that ends it), and the holder's state, marked unsent
    /// while its token was never sent.
    pub(super) fn begin_save(&self, key: &Key, kept: Duration) -> Result<Arc<HolderState>> {
        key.reduce_lifetime(kept);
        if key.is_expired() {
            return Err(Error::expired(key.resource()).with_store(self));
        }
        let state = key.handle::<HolderState>(self.inner.owner);
        if !key.has_token(KIND) {
            // A token made now was never sent: until a statement may carry it, a release of
            // this holder has nothing to delete.
            state.unsent.store(true, Ordering::Release);
        }
        Ok(state)
    }

    pub(super) async fn save_write(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        let secs = self.ttl_seconds(key, ttl)?;
        // The row may be taken up to 1 s early (whole seconds): the local deadline is the ttl
        // less that, set before the round trip.
        let state = self.begin_save(
            key,
            Duration::from_secs(u64::try_from(secs - 1).unwrap_or(1)),
        )?;
        let (id, token) = (key_id(key.resource()), key.token(KIND));
        let how = Run {
            unsent: Some(state.unsent.clone()),
            ..Run::keeping(&self.inner, key)
        };
        let meta = key.meta();
        // MySQL writes a re-saved holder's record only when its metadata changed.
        let resave = state.written(&meta);
        let record = Arc::new((stored_name(key.resource()), HolderRecord::now(key)));
        let (saved, sent) = {
            let (id, token, state) = (id.clone(), token.clone(), state.clone());
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
                        resave,
                    };
                    // Whether this holder's row was certainly unexpired as the statement goes
                    // out: then finding our row means a re-save, and nobody can have drawn a
                    // token since ours.
                    let sent = Instant::now();
                    let live = inner.held.held_by(&id, |t| t == token) && state.live_at(sent);
                    let ids = (id.as_str(), token.as_str());
                    let place = queue::place_of(inner, &state);
                    let fair = inner.queue.as_ref().zip(place);
                    let saved =
                        queue_mysql::save(conn, &inner.sql, ids, secs, (&rec, fair)).await?;
                    if place.is_some_and(|p| p < super::queue_sql::NEWCOMER)
                        && matches!(saved, queries::Saved::Conflict { .. })
                    {
                        queue::left_meanwhile(conn, inner, &state, ids).await?;
                    }
                    match saved {
                        // Our row, and we cannot tell whether we just wrote it: an earlier run
                        // of this statement landed and its answer was lost with its connection
                        // (this is the rerun after a broken one), or a save given up on at its
                        // time limit landed after it; with it went the token it drew, if it
                        // drew one, and others may have held since our last hold. A new
                        // acquisition always has a token: draw another, larger.
                        queries::Saved::Acquired { fence: None } if rerun || !live => {
                            let fence = queries::draw(conn, &inner.sql, &id).await?;
                            Ok((queries::Saved::Acquired { fence: Some(fence) }, sent))
                        }
                        saved => Ok((saved, sent)),
                    }
                })
            })
            .await?
        };
        match saved {
            queries::Saved::Acquired { fence } => {
                // No longer waiting: the save took its ticket out.
                *lock(&state.waiting) = None;
                state.confirm(sent + Duration::from_secs(u64::try_from(secs - 1).unwrap_or(0)));
                state.wrote(meta);
                self.inner.held.hold(&state.claim, &id, &token);
                self.inner.wakers.notify(&changes_id(&id));
                self.maybe_sweep();
                check_expiry(self, key).await?;
                Ok(acquired(fence))
            }
            queries::Saved::Conflict { holder, queued } => {
                Ok(self.conflicted(&state, (&id, &token), holder.as_ref(), queued))
            }
        }
    }

    /// A save refused: kept out of a free lock by a waiter queued before it (`queued`, and
    /// nobody live holds), or refused because `holder` holds.
    fn conflicted(
        &self,
        state: &HolderState,
        (id, token): (&str, &str),
        holder: Option<&queries::Row>,
        queued: bool,
    ) -> Saved {
        let free = holder.is_none_or(|h| h.left_ms.is_some_and(|l| l <= 0));
        if queued && free {
            // A free lock kept for a waiter queued before this one.
            self.forget(id, token);
            return Saved::Conflict(Conflict::new().with_retry_after(queue::QUEUE_RECHECK));
        }
        self.refused_save(state, (id, token), holder)
    }

    /// A save refused because `holder` holds: whatever this holder held here is gone, and its
    /// wait learns whether the release it waits for will be announced.
    fn refused_save(
        &self,
        state: &HolderState,
        (id, token): (&str, &str),
        holder: Option<&queries::Row>,
    ) -> Saved {
        self.forget(id, token);
        let here = holder.is_some_and(|h| self.inner.held.held_by(id, |t| t == h.token));
        let via_listener = !here
            && self.inner.flavor == Flavor::Postgres
            && holder.is_some_and(|h| announces(&h.token));
        state
            .announced
            .store(here || via_listener, Ordering::Release);
        state.via_listener.store(via_listener, Ordering::Release);
        refused(holder)
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
        let sent = Instant::now();
        let extended = {
            let (id, token) = (id.clone(), token.clone());
            let how = Run::keeping(&self.inner, key);
            self.run(key.resource(), how, move |conn, inner| {
                let (id, token) = (id.clone(), token.clone());
                Box::pin(async move { queries::refresh(conn, &inner.sql, &id, &token, secs).await })
            })
            .await?
        };
        if extended {
            key.handle::<HolderState>(self.inner.owner)
                .confirm(sent + Duration::from_secs(u64::try_from(secs - 1).unwrap_or(0)));
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
        if self.inner.pools.file_missing() {
            return Ok(None);
        }
        self.run(
            key.resource(),
            Run::plain(&self.inner),
            move |conn, inner| {
                let id = id.clone();
                Box::pin(async move { queries::read(conn, &inner.sql, &id).await })
            },
        )
        .await
    }

    pub(super) async fn remove(&self, key: &Key) -> Result<bool> {
        if !key.has_token(KIND) {
            return Ok(false);
        }
        let (id, token) = (key_id(key.resource()), key.token(KIND));
        let unsent = key
            .handle::<HolderState>(self.inner.owner)
            .unsent
            .load(Ordering::Acquire);
        if unsent || self.inner.pools.file_missing() {
            // Nothing of this holder ever reached the database, or there is no database.
            self.forget(&id, &token);
            return Ok(false);
        }
        let live = {
            let (id, token) = (id.clone(), token.clone());
            self.run(
                key.resource(),
                Run::release(&self.inner),
                move |conn, inner| {
                    let (id, token) = (id.clone(), token.clone());
                    Box::pin(async move {
                        let sql = (&inner.sql, inner.rec.delete.as_str());
                        queries::delete(conn, sql, &id, &token, &inner.channel).await
                    })
                },
            )
            .await?
        };
        self.forget(&id, &token);
        self.inner.wakers.notify(&id);
        Ok(live)
    }

    /// Forgets `token` as this store's holder of `id` (released, lost or taken over), so the
    /// map of holders keeps only the live ones.
    pub(super) fn forget(&self, id: &str, token: &str) {
        self.inner.held.forget(id, token);
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

    pub(super) async fn watcher(&self, key: &Key, since: std::time::SystemTime) -> Watcher {
        let id = wake_id(key);
        let mut rx = self.inner.wakers.subscribe(&id);
        if self.inner.flavor == Flavor::Postgres {
            self.ensure_listener().await;
        }
        let state = key.handle::<HolderState>(self.inner.owner);
        let (announced, via) = (state.announced.clone(), state.via_listener.clone());
        let wakers = self.inner.wakers.clone();
        // A queued waiter's place, held while this watcher lives; it looks again now and then
        // so that its save keeps its ticket from expiring.
        let place = key
            .has_token(KIND)
            .then(|| self.hold_place(&state, (id, key.token(KIND)), since))
            .flatten();
        let refresh = place.is_some();
        Watcher::with_coverage(
            async move {
                let changed = async {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                if refresh {
                    let _ = tokio::time::timeout(queue::TICKET_REFRESH, changed).await;
                } else {
                    changed.await;
                }
            },
            move || {
                let _ = &place;
                announced.load(Ordering::Acquire)
                    && (!via.load(Ordering::Acquire) || wakers.listening())
            },
        )
    }

    /// Starts the PostgreSQL listener unless it runs; the first time, waits (briefly) until it
    /// listens, so the first waiters need not poll.
    pub(super) async fn ensure_listener(&self) {
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

    pub(super) fn db_error(&self, e: sqlx::Error, resource: Option<&str>) -> Error {
        let err = map_error(e, &self.inner).with_store(self);
        match resource {
            Some(r) => err.with_resource(r),
            None => err,
        }
    }
}
