//! The statements of each operation, run on a connection of one of the three pools. Results
//! are plain values; the store makes outcomes and errors of them.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, MySql, MySqlPool, PgPool, Postgres, Sqlite, SqlitePool};

use super::dialect::{Flavor, Sql};
use super::queue_sql::{NEWCOMER, QueueSql, enqueue, unqueue};
use super::records::{Rec, record_of, upsert_record};
use crate::meta::HolderRecord;

/// Runs `$body` with `$c` the driver's own connection, on each of the three pools.
macro_rules! on_conn {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn {
            Conn::Postgres(p) => {
                let $c = &mut **p;
                $body
            }
            Conn::MySql(p) => {
                let $c = &mut **p;
                $body
            }
            Conn::Sqlite(p) => {
                let $c = &mut **p;
                $body
            }
        }
    };
}
pub(crate) use on_conn;

/// One of the three pools.
#[derive(Debug, Clone)]
pub(crate) enum Pool {
    Postgres(PgPool),
    MySql(MySqlPool),
    Sqlite(SqlitePool),
}

impl Pool {
    pub(crate) fn flavor(&self) -> Flavor {
        match self {
            Pool::Postgres(_) => Flavor::Postgres,
            Pool::MySql(_) => Flavor::MySql,
            Pool::Sqlite(_) => Flavor::Sqlite,
        }
    }

    /// A connection of the pool, within the pool's connect timeout; or, when `probe` (a caller
    /// with a deadline, never a release, which rides out a restart on the pool's own retries),
    /// why none can be opened (a refused connection) as soon as that is known.
    pub(crate) async fn acquire(&self, probe: bool) -> Db<Conn> {
        let pooled = async {
            Ok(match self {
                Pool::Postgres(p) => Conn::Postgres(p.acquire().await?),
                Pool::MySql(p) => Conn::MySql(p.acquire().await?),
                Pool::Sqlite(p) => Conn::Sqlite(p.acquire().await?),
            })
        };
        if !probe {
            return pooled.await;
        }
        tokio::select! {
            biased;
            conn = pooled => conn,
            why = self.why_no_connection() => Err(why),
        }
    }

    /// Why the pool cannot open a connection, once that is seen; pending while it may.
    ///
    /// The pool tries a refused connection again and again (and one to a server starting up,
    /// or full) until its acquire timeout, and then says only that it timed out: the cause is
    /// lost, and the caller waited the whole timeout, past its own deadline. So when the pool
    /// has given no connection within a moment, and is opening one rather than waiting for one
    /// in use, one connection is opened beside it: its error is the answer. A local connect
    /// takes milliseconds, so the extra one is rare (and closed at once when it succeeds).
    async fn why_no_connection(&self) -> sqlx::Error {
        tokio::time::sleep(PROBE_AFTER).await;
        let failed = match self {
            Pool::Postgres(p) => connect_beside(p).await,
            Pool::MySql(p) => connect_beside(p).await,
            // A file: nothing to be refused by.
            Pool::Sqlite(_) => None,
        };
        match failed {
            Some(why) => why,
            None => std::future::pending().await,
        }
    }

    /// Closes the pool, waiting at most `bound` for the connections in use to come back (one
    /// stuck on a silent server never does); the pool is closed either way.
    pub(crate) async fn close_within(&self, bound: Duration) {
        let _ = tokio::time::timeout(bound, self.close()).await;
    }

    pub(crate) async fn close(&self) {
        match self {
            Pool::Postgres(p) => p.close().await,
            Pool::MySql(p) => p.close().await,
            Pool::Sqlite(p) => p.close().await,
        }
    }
}

/// How long an acquire waits for its pool before it tries a connection beside it.
const PROBE_AFTER: Duration = Duration::from_millis(250);

/// Opens (and closes) one connection to `pool`'s server, unless the pool has one idle or is
/// full (its acquire waits for a connection in use, not for the server): the error, if any.
async fn connect_beside<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> Option<sqlx::Error> {
    use sqlx::{ConnectOptions as _, Connection as _};
    if pool.num_idle() > 0 || pool.size() >= pool.options().get_max_connections() {
        return None;
    }
    match pool.connect_options().connect().await {
        Ok(conn) => {
            let _ = conn.close().await;
            None
        }
        // A server starting up or full: the pool's own retries may yet get a connection.
        Err(why) if passes(&why) => None,
        Err(why) => Some(why),
    }
}

/// Whether a failed connect is one the pool rides out: PostgreSQL starting up (SQLSTATE 57P03)
/// or out of connections (53300), MySQL out of connections (1040, SQLSTATE 08004).
fn passes(why: &sqlx::Error) -> bool {
    why.as_database_error()
        .is_some_and(|db| matches!(db.code().as_deref(), Some("57P03" | "53300" | "08004")))
}

/// A connection taken from one of the three pools: dropped, it goes back to the pool (which
/// pings it first), unless [`Conn::discard`] said to close it.
pub(crate) enum Conn {
    Postgres(PoolConnection<Postgres>),
    MySql(PoolConnection<MySql>),
    Sqlite(PoolConnection<Sqlite>),
}

impl Conn {
    /// Closes the connection when it drops, instead of handing it back: a statement given up
    /// on leaves it in doubt, and the pool's ping on its return would wait on a silent server
    /// for as long as it stays silent, keeping the pool from closing.
    pub(crate) fn discard(&mut self) {
        match self {
            Conn::Postgres(c) => c.close_on_drop(),
            Conn::MySql(c) => c.close_on_drop(),
            Conn::Sqlite(c) => c.close_on_drop(),
        }
    }
}

type Db<T> = Result<T, sqlx::Error>;

/// A resource's row as a statement found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) token: String,
    pub(crate) live: bool,
    /// Milliseconds until the row can be taken, by the database's clock.
    pub(crate) left_ms: Option<i64>,
}

/// What an acquiring statement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Saved {
    /// The row is ours. `fence` is the new fencing token of a new acquisition (a new row, or the
    /// takeover of an expired one); `None` for a re-save of our own row.
    Acquired { fence: Option<u64> },
    /// Someone else's live row, as far as the statement saw it; or (`queued`) a free or
    /// expired row kept for a waiter queued before the caller.
    Conflict { holder: Option<Row>, queued: bool },
}

fn fence(n: Option<i64>) -> Option<u64> {
    n.and_then(|n| u64::try_from(n).ok())
}

fn row((token, live, left_ms): (String, bool, Option<i64>)) -> Row {
    Row {
        token,
        live,
        left_ms,
    }
}

/// Writes `rec`'s record of (`id`, `token`); `new` resets its acquisition time.
async fn upsert(conn: &mut Conn, rec: &Rec<'_>, ids: (&str, &str), new: bool) -> Db<()> {
    on_conn!(conn, |c| upsert_record!(rec, c, ids, new, None))
}

/// Acquires `id` for `token` for `ttl` whole seconds, writing the holder's record `rec` with it
/// (in the statement on PostgreSQL, in the transaction on SQLite, after it on MySQL). `fair`:
/// the queue, and the caller's place in it (see `queue`).
pub(crate) async fn save(
    conn: &mut Conn,
    sql: &Sql,
    (id, token): (&str, &str),
    ttl: i32,
    (rec, fair): (&Rec<'_>, Option<(&QueueSql, i64)>),
) -> Db<Saved> {
    match conn {
        Conn::Postgres(p) => {
            type Answer = (bool, Option<i64>, Option<String>, Option<i64>, bool);
            let q = sqlx::query_as(AssertSqlSafe(sql.save.as_str()))
                .bind(id)
                .bind(token)
                .bind(ttl)
                .bind(rec.resource)
                .bind(rec.text());
            let q = match fair {
                Some((_, since)) => q.bind(since).bind(super::queue_sql::ticket_ms()),
                None => q,
            };
            let (got, n, holder, left, queued): Answer = q.fetch_one(&mut **p).await?;
            if got {
                return Ok(Saved::Acquired { fence: fence(n) });
            }
            Ok(Saved::Conflict {
                holder: holder.map(|token| Row {
                    token,
                    live: true,
                    left_ms: left,
                }),
                queued,
            })
        }
        Conn::MySql(p) => {
            let done = sqlx::query(AssertSqlSafe(sql.save.as_str()))
                .bind(id)
                .bind(token)
                .bind(ttl)
                .execute(&mut **p)
                .await?;
            match done.last_insert_id() {
                // Our own row (a re-save, the same second's included): its record is written
                // again only when it changed.
                1 => {
                    if rec.resave {
                        upsert_after(conn, rec, (id, token), false).await;
                    }
                    Ok(Saved::Acquired { fence: None })
                }
                // A new row, or an expired one taken over.
                0 | 2 => {
                    let fence = draw(conn, sql, id).await?;
                    upsert_after(conn, rec, (id, token), true).await;
                    Ok(Saved::Acquired { fence: Some(fence) })
                }
                _ => Ok(Saved::Conflict {
                    holder: read(conn, sql, id).await?,
                    queued: false,
                }),
            }
        }
        Conn::Sqlite(p) => save_sqlite(p, sql, (id, token), ttl, (rec, fair)).await,
    }
}

/// MySQL's record, written after the lock row committed: best effort, since failing the save
/// now would leave the row held by a caller told it failed (the holder then shows without
/// metadata).
async fn upsert_after(conn: &mut Conn, rec: &Rec<'_>, holder: (&str, &str), fresh: bool) {
    if let Err(err) = upsert(conn, rec, holder, fresh).await {
        tracing::warn!(target: crate::logging::TARGET, error = %err,
            "could not write the holder's record; it shows without metadata");
    }
}

/// SQLite's save: the row is read, the queue checked, then the row saved, in one write
/// transaction (in-process: the queue's statements cost no round trip).
async fn save_sqlite(
    p: &mut PoolConnection<Sqlite>,
    sql: &Sql,
    (id, token): (&str, &str),
    ttl: i32,
    (rec, fair): (&Rec<'_>, Option<(&QueueSql, i64)>),
) -> Db<Saved> {
    // The write transaction holds the database's write lock from its first statement,
    // so the row read here is the row the upsert meets.
    let mut tx = sqlx::Connection::begin_with(&mut **p, "BEGIN IMMEDIATE").await?;
    let found: Option<(String, bool, Option<i64>)> =
        sqlx::query_as(AssertSqlSafe(sql.read.as_str()))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let found = found.map(row);
    let mine = found.as_ref().is_some_and(|r| r.token == token);
    let taken = found.as_ref().is_some_and(|r| r.token != token && r.live);
    // Kept out by a waiter queued before the caller (never its own row: a re-save).
    let queued = match fair {
        Some((q, since)) if !mine && !taken => {
            sqlx::query_scalar::<_, bool>(AssertSqlSafe(q.blocked.as_str()))
                .bind(id)
                .bind(token)
                .bind(since)
                .fetch_one(&mut *tx)
                .await?
        }
        _ => false,
    };
    if taken || queued {
        return refuse_sqlite(
            tx,
            (id, token),
            fair,
            Saved::Conflict {
                holder: found,
                queued,
            },
        )
        .await;
    }
    let got: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql.save.as_str()))
        .bind(id)
        .bind(token)
        .bind(ttl)
        .fetch_optional(&mut *tx)
        .await?;
    if got.is_none() {
        let refused = Saved::Conflict {
            holder: found,
            queued: false,
        };
        return refuse_sqlite(tx, (id, token), fair, refused).await;
    }
    let new = !mine;
    let n = if new {
        Some(
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.draw.as_str()))
                .bind(id)
                .fetch_one(&mut *tx)
                .await?,
        )
    } else {
        None
    };
    upsert_record!(rec, &mut *tx, (id, token), new, None)?;
    if let Some((q, since)) = fair
        && since < NEWCOMER
    {
        unqueue!(q, &mut *tx, (id, token))?;
    }
    tx.commit().await?;
    Ok(Saved::Acquired { fence: fence(n) })
}

/// Ends SQLite's refused save: a waiter's ticket is queued (or refreshed) and committed;
/// otherwise nothing was written.
async fn refuse_sqlite(
    mut tx: sqlx::Transaction<'_, Sqlite>,
    (id, token): (&str, &str),
    fair: Option<(&QueueSql, i64)>,
    refused: Saved,
) -> Db<Saved> {
    match fair {
        Some((q, since)) if since < NEWCOMER => {
            enqueue!(q, &mut *tx, (id, token), since, 0u32)?;
            tx.commit().await?;
        }
        _ => tx.rollback().await?,
    }
    Ok(refused)
}

/// Draws `id`'s next fencing token (outside an acquiring statement: MySQL's second statement,
/// or a token an acquisition did not bring back).
pub(crate) async fn draw(conn: &mut Conn, sql: &Sql, id: &str) -> Db<u64> {
    let q = AssertSqlSafe(sql.draw.as_str());
    let n = match conn {
        Conn::Postgres(p) => {
            sqlx::query_scalar::<_, i64>(q)
                .bind(id)
                .fetch_one(&mut **p)
                .await?
        }
        Conn::MySql(p) => {
            let drawn = sqlx::query(q).bind(id).execute(&mut **p).await?;
            return Ok(drawn.last_insert_id());
        }
        Conn::Sqlite(p) => {
            sqlx::query_scalar::<_, i64>(q)
                .bind(id)
                .fetch_one(&mut **p)
                .await?
        }
    };
    u64::try_from(n)
        .map_err(|_| sqlx::Error::Decode(format!("a negative fencing counter: {n}").into()))
}

/// The row of `id`, if there is one.
pub(crate) async fn read(conn: &mut Conn, sql: &Sql, id: &str) -> Db<Option<Row>> {
    let q = AssertSqlSafe(sql.read.as_str());
    Ok(match conn {
        Conn::Postgres(p) => sqlx::query_as::<_, (String, bool, Option<i64>)>(q)
            .bind(id)
            .fetch_optional(&mut **p)
            .await?
            .map(row),
        Conn::MySql(p) => sqlx::query_as::<_, (String, Option<i64>, Option<i64>)>(q)
            .bind(id)
            .fetch_optional(&mut **p)
            .await?
            .map(|(t, live, left)| row((t, live == Some(1), left))),
        Conn::Sqlite(p) => sqlx::query_as::<_, (String, bool, Option<i64>)>(q)
            .bind(id)
            .fetch_optional(&mut **p)
            .await?
            .map(row),
    })
}

/// Extends our live row to now + `ttl`; whether it did.
pub(crate) async fn refresh(
    conn: &mut Conn,
    sql: &Sql,
    id: &str,
    token: &str,
    ttl: i32,
) -> Db<bool> {
    let q = AssertSqlSafe(sql.refresh.as_str());
    let done = match conn {
        Conn::Postgres(p) => sqlx::query(q)
            .bind(id)
            .bind(token)
            .bind(ttl)
            .execute(&mut **p)
            .await?
            .rows_affected(),
        Conn::MySql(p) => sqlx::query(q)
            .bind(ttl)
            .bind(id)
            .bind(token)
            .execute(&mut **p)
            .await?
            .rows_affected(),
        Conn::Sqlite(p) => sqlx::query(q)
            .bind(id)
            .bind(token)
            .bind(ttl)
            .execute(&mut **p)
            .await?
            .rows_affected(),
    };
    if done > 0 {
        return Ok(true);
    }
    // MySQL without CLIENT_FOUND_ROWS counts an unchanged row (our own refresh within the same
    // second) as 0: the row says whether it is still ours and live.
    if matches!(conn, Conn::MySql(_)) {
        return Ok(read(conn, sql, id)
            .await?
            .is_some_and(|r| r.token == token && r.live));
    }
    Ok(false)
}

/// Tells PostgreSQL's listeners that `id`'s row changed (waiters read it again); nothing on
/// the other databases, which have no listeners.
pub(crate) async fn announce(conn: &mut Conn, channel: &str, id: &str) -> Db<()> {
    if let Conn::Postgres(p) = conn {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(channel)
            .bind(id)
            .execute(&mut **p)
            .await?;
    }
    Ok(())
}

/// Deletes our row; whether it was live. PostgreSQL notifies `channel` when a row went.
pub(crate) async fn delete(
    conn: &mut Conn,
    (sql, rec_delete): (&Sql, &str),
    id: &str,
    token: &str,
    channel: &str,
) -> Db<bool> {
    let q = AssertSqlSafe(sql.delete.as_str());
    Ok(match conn {
        Conn::Postgres(p) => sqlx::query_scalar::<_, bool>(q)
            .bind(id)
            .bind(token)
            .bind(channel)
            .fetch_optional(&mut **p)
            .await?
            .unwrap_or(false),
        Conn::MySql(p) => {
            let live = sqlx::query(q)
                .bind(id)
                .bind(token)
                .execute(&mut **p)
                .await?;
            if live.rows_affected() > 0 {
                true
            } else {
                // An expired row of ours, if any, goes too.
                sqlx::query(AssertSqlSafe(sql.delete_any.as_str()))
                    .bind(id)
                    .bind(token)
                    .execute(&mut **p)
                    .await?;
                false
            }
        }
        Conn::Sqlite(p) => {
            let live = sqlx::query_scalar::<_, bool>(q)
                .bind(id)
                .bind(token)
                .fetch_optional(&mut **p)
                .await?
                .unwrap_or(false);
            // In-process: a second statement costs no round trip.
            sqlx::query(AssertSqlSafe(rec_delete))
                .bind(id)
                .bind(token)
                .execute(&mut **p)
                .await?;
            live
        }
    })
}

/// The live holder of `id`: token, milliseconds left, its record where it is ours.
pub(crate) async fn holders(
    conn: &mut Conn,
    sql: &Sql,
    id: &str,
) -> Db<Vec<(String, i64, Option<HolderRecord>)>> {
    type Found = (
        String,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<i64>,
    );
    let q = AssertSqlSafe(sql.holders.as_str());
    let rows: Vec<Found> = match conn {
        Conn::Postgres(p) => sqlx::query_as(q).bind(id).fetch_all(&mut **p).await?,
        Conn::MySql(p) => sqlx::query_as(q).bind(id).fetch_all(&mut **p).await?,
        Conn::Sqlite(p) => sqlx::query_as(q).bind(id).fetch_all(&mut **p).await?,
    };
    Ok(rows
        .into_iter()
        .map(|(t, left, record, at, n)| (t, left.unwrap_or(0).max(0), record_of(record, at, n)))
        .collect())
}

/// The fencing counter of `id` (0 before its first acquisition).
pub(crate) async fn fence_counter(conn: &mut Conn, sql: &Sql, id: &str) -> Db<u64> {
    let q = AssertSqlSafe(sql.fence.as_str());
    let n: Option<i64> = match conn {
        Conn::Postgres(p) => {
            sqlx::query_scalar(q)
                .bind(id)
                .fetch_optional(&mut **p)
                .await?
        }
        Conn::MySql(p) => {
            sqlx::query_scalar(q)
                .bind(id)
                .fetch_optional(&mut **p)
                .await?
        }
        Conn::Sqlite(p) => {
            sqlx::query_scalar(q)
                .bind(id)
                .fetch_optional(&mut **p)
                .await?
        }
    };
    Ok(fence(n).unwrap_or(0))
}

/// Runs a statement without parameters; the rows it touched.
pub(crate) async fn execute(conn: &mut Conn, text: &str) -> Db<u64> {
    let q = AssertSqlSafe(text);
    Ok(match conn {
        Conn::Postgres(p) => sqlx::query(q).execute(&mut **p).await?.rows_affected(),
        Conn::MySql(p) => sqlx::query(q).execute(&mut **p).await?.rows_affected(),
        Conn::Sqlite(p) => sqlx::query(q).execute(&mut **p).await?.rows_affected(),
    })
}
