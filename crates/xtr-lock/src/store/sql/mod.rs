//! [`SqlStore`]: locks as rows of Symfony Lock's `lock_keys` table on PostgreSQL,
//! MySQL/MariaDB and SQLite, shared with PHP processes on Symfony's `PdoStore`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use sha2::{Digest as _, Sha256};

use super::held::Held;
use super::{
    Acquired, Capabilities, Conflict, HandleOwner, HolderInfo, Holding, LostReason, Saved, Store,
    Watcher, check_expiry,
};
use crate::error::{Error, Result};
use crate::key::{ANNOUNCING_SUFFIX, Key, Mode};

pub(crate) mod config;
mod dialect;
pub(crate) mod errors;
mod holder_sql;
mod listing;
mod notify;
mod pool;
mod queries;
mod queue;
mod queue_mysql;
mod queue_sql;
mod records;
mod release;
mod schema;
mod sem_queries;
mod sem_sql;
mod semaphore;
mod state;
mod sweep;

use crate::mutex::lock;
use dialect::{Flavor, Sql};
use holder_sql::HolderSql;
use notify::Wakers;
use pool::Pools;
use queries::Pool;
use sem_sql::SemSql;
use state::HolderState;

/// The token kind of SQL stores: Symfony's format (base64 of 32 bytes, 44 characters).
const KIND: &str = "sql";

/// The longest a `close` waits for connections still in use.
const CLOSE_WITHIN: Duration = Duration::from_secs(1);

/// Checks an SQL DSN without building anything.
pub(crate) fn validate_dsn(dsn: &str) -> Result<()> {
    config::parse(dsn).map(|_| ())
}

/// Locks as rows of a table on PostgreSQL, MySQL/MariaDB or SQLite, in Symfony Lock's layout
/// (`lock_keys`: `key_id` = SHA-256 hex of the resource, `key_token`, `key_expiration` in whole
/// Unix seconds on the database's clock), so Rust processes and PHP processes on Symfony's
/// `PdoStore` or `DoctrineDbalStore` sharing one database exclude each other.
///
/// - **One error-free statement** per acquire: an upsert that updates only our own row or an
///   expired one. A refused attempt is an ordinary answer, never a duplicate-key error (no
///   server-log noise, no aborted transaction). On MySQL a new acquisition draws its fencing
///   token with a second statement.
/// - **Its own connections, autocommit**: never the application's transaction, so a lock is
///   visible at once and a rollback does not undo it.
/// - **The database's clock**, read once per statement and quantised as Symfony does. Rows keep
///   whole seconds, so a row may be taken up to 1 s before its ttl ends: the key's lifetime is
///   the ttl less 1 s, and a ttl under 2 s is refused.
/// - **Exclusive only**: Symfony's table has no shared locks, so a read lock takes the
///   exclusive lock ([`Capabilities::shared`] is false).
/// - **Woken on release**: on PostgreSQL a release notifies (`pg_notify` in the deleting
///   statement) and waiters share one `LISTEN` connection per store; on MySQL and SQLite the
///   releases of this store's own holders wake its waiters in-process. Behind anyone else (a
///   Symfony holder, another process on MySQL) waiters poll every 100 ms ± 10 %, Symfony's rate,
///   and try at once when the holder's row expires.
/// - **Fencing tokens** from a per-resource counter in a companion table `<table>_fence`,
///   advanced with each new exclusive acquisition (in the acquiring statement on PostgreSQL, in
///   the same transaction on SQLite, right after it while held on MySQL). Symfony neither reads
///   nor advances it, so tokens fence among this library's processes.
/// - Expired rows are swept in the background (at most 100 per sweep, at most once a minute),
///   never on an acquire's path, never a live row.
///
/// # Guarantees
///
/// Excludes everyone using this table in the same database: other processes and machines, and
/// PHP processes on Symfony's table stores. A lock outlives a crashed holder until its ttl.
///
/// # Failure modes
///
/// - An unreachable, paused or cut-off database gives a storage error (marked temporary)
///   within the statement timeout (5 s by default; connecting included, and no later than the
///   lifetime a save or renewal can still keep), never a hang. Waiting for a connection ends as
///   soon as the caller stops waiting (a `-w` deadline, a dropped acquire): nothing was sent,
///   and the release after it has nothing to delete. A connection whose statement got no
///   answer is closed, never handed back; `close` waits at most a second.
/// - A missing table, or one with other columns, is an error naming the table and what is
///   wrong; `xtr-lock migrate --store DSN` or [`create_table`](SqlStore::create_table) makes it
///   (or `?create_table=true`, on first use).
/// - PostgreSQL's `INTEGER` column (Symfony's type, kept for interop) overflows in January 2038.
/// - SQLite: a writing transaction elsewhere on the same file blocks the store's statements
///   until it ends (at most the statement timeout).
///
/// # Clock assumptions
///
/// Only the database's clock counts; clients' clocks do not matter. The local deadline is
/// measured on the key's monotonic clock from before the round trip, so it is never later than
/// the database's.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// use std::time::Duration;
/// use xtr_lock::{LockFactory, Lockable as _, SqlStore};
///
/// let store = SqlStore::from_dsn("postgres://app@db/app?create_table=true")?;
/// let lock = LockFactory::new(store).create_lock("invoice:42").with_ttl(Duration::from_secs(30));
/// if lock.try_acquire().await? {
///     let _ = lock.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    shown: String,
    table: String,
    flavor: Flavor,
    sql: Sql,
    /// The semaphores' statements (`<table>_sem`, `<table>_perm`).
    sem: SemSql,
    /// The holders' records' statements (`<table>_holder`).
    rec: HolderSql,
    /// Waiters are served in arrival order (`?fair=false` lets newcomers barge).
    fair: bool,
    /// The fair queue's statements (`<table>_queue`), on a fair store.
    queue: Option<queue_sql::QueueSql>,
    pools: Pools,
    create_table: bool,
    statement_timeout: Duration,
    /// The table was found (or made) as it should be.
    schema: tokio::sync::OnceCell<()>,
    /// The semaphores' tables were found (or made) as they should be.
    sem_schema: tokio::sync::OnceCell<()>,
    wakers: Arc<Wakers>,
    /// PostgreSQL's notification channel of this table.
    channel: String,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The resources this store's holders hold now (`key_id` → token): a waiter behind one of
    /// them is woken in-process.
    held: Held,
    owner: HandleOwner,
    sweep_every: Duration,
    swept: Mutex<Option<Instant>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.listener).take() {
            task.abort();
        }
    }
}

/// The `key_id` of a resource: 64 lowercase hex digits of the SHA-256 of its UTF-8 bytes,
/// as Symfony's table stores compute it.
pub fn key_id(resource: &str) -> String {
    Sha256::digest(resource.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl SqlStore {
    /// A store on the database `dsn` names: `postgres://` or `postgresql://`, `mysql://` or
    /// `mariadb://` (`[user[:password]@]host[:port]/database`), `sqlite:///absolute/path.db`, or
    /// `sqlite::memory:`; with the options `table` (default `lock_keys`), `create_table`
    /// (`true`: make the tables on first use), `fair` (default `true`: waiters served in
    /// arrival order; `false` lets newcomers barge), `connect_timeout` and `statement_timeout`
    /// (seconds, default 5), `max_connections` (default 10); the driver's own options
    /// (`sslmode`, `sslrootcert`, `ssl-mode`, …) go to it, and any other option is refused,
    /// naming it. Touches no network: the pool opens on first use.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) naming what is wrong,
    /// never a credential.
    pub fn from_dsn(dsn: &str) -> Result<Self> {
        let config = config::parse(dsn)?;
        Ok(Self::build(
            Pools::from_config(&config),
            &config.shown,
            &config.table,
            config.create_table,
            config.statement_timeout,
        )
        .with_fairness(config.fair))
    }

    /// A store over a PostgreSQL pool you built. Its connections must be in autocommit (the
    /// store never opens a transaction on them).
    pub fn from_pg_pool(pool: sqlx::PgPool) -> Self {
        let shown = pool::describe_pg(&pool);
        Self::from_pool(Pool::Postgres(pool), shown)
    }

    /// A store over a MySQL or MariaDB pool you built (with or without `CLIENT_FOUND_ROWS`).
    pub fn from_mysql_pool(pool: sqlx::MySqlPool) -> Self {
        Self::from_pool(Pool::MySql(pool), "mysql".to_owned())
    }

    /// A store over an SQLite pool you built.
    pub fn from_sqlite_pool(pool: sqlx::SqlitePool) -> Self {
        Self::from_pool(Pool::Sqlite(pool), "sqlite".to_owned())
    }

    fn from_pool(pool: Pool, shown: String) -> Self {
        Self::build(
            Pools::given(pool),
            &shown,
            config::DEFAULT_TABLE,
            false,
            config::DEFAULT_TIMEOUT,
        )
    }

    fn build(
        pools: Pools,
        shown: &str,
        table: &str,
        create_table: bool,
        statement_timeout: Duration,
    ) -> Self {
        let flavor = pools.flavor();
        let channel = format!("xtr_lock_{}", &key_id(table)[..16]);
        let queue = Some(queue_sql::QueueSql::new(flavor, table));
        let mut sql = Sql::new(flavor, table);
        if queue.is_some() {
            queue_sql::fair_statements(&mut sql, flavor, table);
        }
        SqlStore {
            inner: Arc::new(Inner {
                shown: shown.to_owned(),
                table: table.to_owned(),
                flavor,
                sql,
                sem: SemSql::new(flavor, table),
                rec: HolderSql::new(flavor, table),
                fair: true,
                queue,
                pools,
                create_table,
                statement_timeout,
                schema: tokio::sync::OnceCell::new(),
                sem_schema: tokio::sync::OnceCell::new(),
                wakers: Arc::default(),
                channel,
                listener: Mutex::new(None),
                held: Held::default(),
                owner: HandleOwner::new(),
                sweep_every: Duration::from_secs(60),
                swept: Mutex::new(None),
            }),
        }
    }

    fn rebuilt(&self, f: impl FnOnce(&mut Inner)) -> Self {
        let old = &self.inner;
        let mut store = Self::build(
            old.pools.clone(),
            &old.shown,
            &old.table,
            old.create_table,
            old.statement_timeout,
        );
        let inner = Arc::get_mut(&mut store.inner).expect("a store just built");
        inner.sweep_every = old.sweep_every;
        inner.fair = old.fair;
        f(inner);
        inner.sql = Sql::new(inner.flavor, &inner.table);
        inner.queue =
            Some(queue_sql::QueueSql::new(inner.flavor, &inner.table)).filter(|_| inner.fair);
        if inner.queue.is_some() {
            queue_sql::fair_statements(&mut inner.sql, inner.flavor, &inner.table);
        }
        inner.sem = SemSql::new(inner.flavor, &inner.table);
        inner.rec = HolderSql::new(inner.flavor, &inner.table);
        inner.channel = format!("xtr_lock_{}", &key_id(&inner.table)[..16]);
        store
    }

    /// The same database with another table (its fencing table is `<table>_fence`).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) unless `table` is a
    /// plain identifier (it is spliced into SQL).
    pub fn with_table(&self, table: &str) -> Result<Self> {
        config::check_table(table)?;
        Ok(self.rebuilt(|inner| {
            inner.table = table.to_owned();
            if !inner.shown.contains("?table=") && table != config::DEFAULT_TABLE {
                inner.shown = format!("{}?table={table}", inner.shown);
            }
        }))
    }

    /// Makes the tables on first use when they are missing (`CREATE TABLE IF NOT EXISTS`, in
    /// autocommit on the store's own connection).
    pub fn with_table_creation(&self, create: bool) -> Self {
        self.rebuilt(|inner| inner.create_table = create)
    }

    /// How often expired rows are swept, at most (default one minute).
    pub fn with_sweep_interval(&self, every: Duration) -> Self {
        self.rebuilt(|inner| inner.sweep_every = every)
    }

    /// The DDL [`create_table`](SqlStore::create_table) runs on this database: the lock table
    /// with Symfony's column types, the fencing table, the holders' records
    /// (`<table>_holder`), the fair queue (`<table>_queue`, on a fair store),
    /// then the semaphores' two tables (`<table>_sem`, `<table>_perm`). For migrations kept
    /// elsewhere.
    pub fn ddl(&self) -> Vec<String> {
        let (locks, sems) = (&self.inner.sql.create, &self.inner.sem.create);
        let records = std::iter::once(&self.inner.rec.create);
        let queue = self.inner.queue.iter().map(|q| &q.create);
        let all = locks.iter().chain(records).chain(queue).chain(sems);
        all.cloned().collect()
    }

    /// The lock table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// Makes the lock table (Symfony's column types on this database), the fencing table and
    /// the semaphores' tables if they are missing, then checks their columns; what `xtr-lock
    /// migrate` runs. Whether anything was made.
    ///
    /// # Errors
    ///
    /// A storage error when the database refused, or when an existing table has other columns.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, some of the tables may have been made; calling it again finishes.
    pub async fn create_table(&self) -> Result<bool> {
        let pool = self.pool().await?;
        let mut conn = pool
            .acquire(true)
            .await
            .map_err(|e| self.db_error(e, None))?;
        let made = schema::ensure(&self.inner, &mut conn, true)
            .await
            .map_err(|e| e.with_store(self))?;
        let _ = self.inner.schema.set(());
        let sems = schema::ensure_semaphores(&self.inner, &mut conn, true)
            .await
            .map_err(|e| e.with_store(self))?;
        let _ = self.inner.sem_schema.set(());
        Ok(made || sems)
    }

    async fn pool(&self) -> Result<Pool> {
        self.inner.pools.get().map_err(|e| self.db_error(e, None))
    }

    fn ttl_seconds(&self, key: &Key, ttl: Option<Duration>) -> Result<i32> {
        let Some(ttl) = ttl else {
            return Err(Error::invalid_argument(
                "a lock in an SQL table needs a ttl (rows expire; there is no silent default): \
                 give the lock one",
            )
            .with_resource(key.resource())
            .with_store(self));
        };
        let secs = whole_seconds(ttl);
        if secs < 2 {
            return Err(Error::invalid_argument(format!(
                "a lock in an SQL table needs a ttl of at least 2 s, not {ttl:?}: rows keep \
                 whole seconds, and a row may be taken up to 1 s before its ttl ends"
            ))
            .with_resource(key.resource())
            .with_store(self));
        }
        Ok(secs)
    }
}

/// The whole seconds of `ttl` a row keeps, bounded so the database's arithmetic cannot overflow
/// on the store's side (PostgreSQL's column still overflows in 2038).
fn whole_seconds(ttl: Duration) -> i32 {
    i32::try_from(ttl.as_secs()).unwrap_or(i32::MAX / 2)
}

mod ops;

impl fmt::Display for SqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.shown)
    }
}

impl fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("database", &self.inner.shown)
            .field("table", &self.inner.table)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for SqlStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: true,
            shared: false,
            blocking: false,
            blocking_shared: false,
            expiring: true,
            fencing: true,
            notifies: true,
            serializable_keys: true,
            introspection: true,
            liveness: false,
            observes_loss: false,
            leased: false,
            counting: true,
            metadata: true,
            lists: true,
            fair: self.inner.queue.is_some(),
        }
    }

    /// The database and table, as a DSN without credentials.
    fn locks_in(&self) -> Option<String> {
        Some(self.inner.shown.clone())
    }

    /// The row's `key_id`, the table and the database.
    fn location(&self, resource: &str) -> Option<String> {
        Some(format!(
            "row key_id={} of table {} in {}",
            key_id(resource),
            self.inner.table,
            self.inner.shown
        ))
    }

    /// One statement (two on MySQL for a new acquisition): insert, re-save our own row, or
    /// take over an expired one; draws the fencing token of a new acquisition.
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        if let Some(permits) = key.permits() {
            return self.sem_save(key, permits, ttl).await;
        }
        self.save_write(key, ttl).await
    }

    /// The table has no shared locks: a read lock is the exclusive lock.
    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        self.save_write(key, ttl).await
    }

    /// One statement that extends our own live row; never inserts, never revives an expired
    /// row. A ttl under 2 s cannot be kept (whole seconds, up to 1 s early): the lock is taken
    /// back and the expiry reported.
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        if key.permits().is_some() {
            return self.sem_put_off(key, ttl).await;
        }
        self.put_off(key, ttl).await
    }

    /// One statement that sets our live row's expiration to outlast `after` (whole seconds,
    /// rounded up, plus the second a row may be taken early); PostgreSQL's waiters are told.
    async fn release_after(&self, key: &Key, after: Duration) -> Result<Option<Holding>> {
        self.release_later(key, after).await.map(Some)
    }

    /// One statement (PostgreSQL also notifies in it); `true` only if our live row went.
    async fn delete(&self, key: &Key) -> Result<bool> {
        if key.permits().is_some() {
            return self.sem_remove(key).await;
        }
        self.remove(key).await
    }

    /// Reads our row: held, expired, taken over or gone.
    async fn exists(&self, key: &Key) -> Result<Holding> {
        if key.permits().is_some() {
            return self.sem_check(key).await;
        }
        self.check(key).await
    }

    /// Registers a waiter on the resource's `key_id`. It sees every release while the holder
    /// met at the last refusal announces its releases: a holder of this store (in-process), or
    /// on PostgreSQL any holder of this library while the listener is up. Otherwise the lock
    /// polls. On a fair store the holder's next saves queue its ticket (`waiting_since` is its
    /// place), kept while one of its watchers lives.
    async fn watch(&self, key: &Key, waiting_since: SystemTime) -> Result<Option<Watcher>> {
        Ok(Some(self.watcher(key, waiting_since).await))
    }

    /// The semaphore's live holder rows and its stored limit, in one statement.
    async fn usage(&self, key: &Key) -> Result<crate::Usage> {
        self.sem_usage(key).await
    }

    /// The live row's holder: its remaining lifetime and token digest.
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        self.who(resource).await
    }

    /// The named holders under `prefix` (our records), and Symfony's rows where they can be
    /// named (see `listing`).
    async fn list(&self, prefix: &str) -> Result<Vec<crate::store::Listing>> {
        self.listing(prefix).await
    }

    /// Woken by this store's acquisitions and releases, and on PostgreSQL by every release of
    /// this library's holders; best effort, the observer polls for the rest.
    async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
        Ok(Some(self.observer(resource).await))
    }

    /// The resource's counter in `<table>_fence` (0 before its first acquisition).
    async fn fencing_counter(&self, resource: &str) -> Result<Option<u64>> {
        self.counter(resource).await.map(Some)
    }

    /// Stops the listener and closes the store's own pool (not a pool you gave it); the next
    /// use opens a new one. Waits at most the statement timeout (and no more than a second)
    /// for connections still in use: a statement left on a silent server (a partition, a
    /// paused server) is given up on, and its connection closed, by its own bound.
    async fn close(&self) -> Result<()> {
        if let Some(task) = lock(&self.inner.listener).take() {
            task.abort();
        }
        let bound = self.inner.statement_timeout.min(CLOSE_WITHIN);
        self.inner.pools.close(bound).await;
        Ok(())
    }
}

/// What a holding row means for `token`.
fn holding(row: Option<&queries::Row>, token: &str) -> Holding {
    match row {
        None => Holding::NotHeld(LostReason::Removed),
        Some(r) if r.token == token && r.live => Holding::Held(Mode::Write),
        Some(r) if r.token == token => Holding::NotHeld(LostReason::Expired),
        Some(_) => Holding::NotHeld(LostReason::TakenOver),
    }
}

/// The name a resource's waiters are woken by: the `key_id` of a lock's, `s:` and the
/// `key_id` for a semaphore's (a lock and a semaphore of one name are unrelated).
fn wake_id(key: &Key) -> String {
    let id = key_id(key.resource());
    if key.permits().is_some() {
        format!("s:{id}")
    } else {
        id
    }
}

/// The name an observer of `id` is woken by on an acquisition by this store's holders.
fn changes_id(id: &str) -> String {
    format!("c:{id}")
}

/// Whether a holder token is one of this library's (its releases announce themselves).
fn announces(token: &str) -> bool {
    token.ends_with(ANNOUNCING_SUFFIX)
}

/// The acquisition a statement reported.
fn acquired(fence: Option<u64>) -> Saved {
    Saved::Acquired(match fence {
        Some(n) => Acquired::fenced(n),
        None => Acquired::new(),
    })
}

/// The refusal a statement reported, with when the holder's row can be taken.
fn refused(holder: Option<&queries::Row>) -> Saved {
    let left = holder.and_then(|r| r.left_ms).unwrap_or(0).max(1);
    Saved::Conflict(Conflict::new().with_retry_after(Duration::from_millis(left as u64 + 5)))
}
