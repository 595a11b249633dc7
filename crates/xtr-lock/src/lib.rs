//! Exclusive and shared (read/write) locks around named resources, in memory, in files, in
//! Redis, in SQL databases, in etcd, in Memcached, in SysV semaphores or across a quorum of
//! stores, behind one API.
//!
//! For workers, cron jobs and services that must not do the same work twice. Where the lock
//! lives is a constructor argument (or a DSN); the lock stays the same. Waiters are woken on
//! release instead of polling, exclusive acquisitions carry fencing tokens, dropped futures
//! leave nothing held, a lost lock is always reported (scopes and guards renew, watch, and stop a
//! body whose lock is gone), and the formats are shared with the Python (`xtr-lock` 4.1.0) and
//! PHP (Symfony Lock) peers so processes in all three languages exclude each other.
//!
//! # Quick start
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
//! use std::time::Duration;
//! use xtr_lock::{LockFactory, Lockable as _};
//!
//! let factory = LockFactory::from_dsn("in-memory")?; // or redis://…, flock:///dir, …
//!
//! let lock = factory.create_lock("nightly-report").with_ttl(Duration::from_secs(60));
//! if lock.try_acquire().await? {
//!     // ... only one worker gets here ...
//!     if !lock.release().await?.was_held() {
//!         // Lost before the release (expired, deleted, taken over): the work was not protected.
//!     }
//! }
//!
//! // Or scoped: wait, run, release on the way out (also on error, panic, cancellation).
//! let rows = lock.scoped(async { Ok::<_, xtr_lock::Error>(42) }).await?;
//! assert_eq!(rows, 42);
//! # Ok(()) }
//! ```
//!
//! # Stores
//!
//! | store | scope | blocking wait | shared | expiring | fencing | wakes on release | loss seen | crash release |
//! |---|---|---|---|---|---|---|---|---|
//! | [`InMemoryStore`] | tasks and threads of one process using one store | emulated | yes | opt-in ([`InMemoryStore::expiring`]) | yes | yes | yes | with the process |
//! | [`FlockStore`] (feature `flock`, Linux) | processes on one machine, with Python xtr-lock and `flock(1)` | yes | yes | no | no | yes (inotify across processes) | yes (a replaced lock file) | yes (kernel) |
//! | `RedisStore` (feature `redis`) | anyone reaching the server, with Python xtr-lock and Symfony Lock | emulated | yes | yes | yes | yes (a wait queue on the server: one wake per release, in arrival order) | by renewal | at ttl |
//! | `RedisPubSubStore` (feature `redis`) | anyone reaching one standalone server, with portalocker 4.2–4.4 | yes | yes | no | yes | yes (notices; any holder's going, by its count) | at once (the connection) | at once |
//! | `SqlStore` (feature `sql`) | anyone using the table in one PostgreSQL, MySQL/MariaDB or SQLite database, with Symfony Lock's `PdoStore` | emulated | no (a read lock is exclusive) | yes (whole seconds) | yes | yes (PostgreSQL `NOTIFY`; in-process on MySQL, SQLite) | by renewal | at ttl |
//! | [`CombinedStore`](store::CombinedStore) | a quorum of any stores, asked concurrently | emulated | yes | if members do | no | yes (a quorum of members) | as its members | as its members |
//! | `PgAdvisoryStore` (feature `sql`) | anyone using advisory locks in one PostgreSQL database, with Symfony Lock's `PostgreSqlStore` (`?keys=crc32`) | yes (in the server) | yes | no | no | yes (in the server) | at once (the session, pinged) | at once (the session ends) |
//! | `MySqlLockStore` (feature `sql`) | anyone using `GET_LOCK` on one MySQL/MariaDB server, by the database's name | yes (in the server) | no (a read lock is exclusive) | no | no | yes (in the server) | at once (the session, pinged) | at once (the session ends) |
//! | `EtcdStore` (feature `etcd`) | anyone reaching the etcd cluster, with `etcdctl lock` and Go's `concurrency.Mutex` | yes (FIFO: each waiter watches the key before it) | yes (readers queue behind writers) | no (an etcd lease the store renews; the ttl is the lease's) | yes (cluster revisions, as `ETCD_LOCK_REV`) | yes (one waiter per release) | at once (key deleted, lease revoked or unconfirmed for its ttl) | at the lease's end |
//! | `MemcachedStore` (feature `memcached`) | anyone using one Memcached ≥ 1.6 server, with Symfony Lock's `MemcachedStore` | emulated | no (a read lock is exclusive) | yes (whole seconds) | no | in-process (others by polling) | by renewal | at ttl |
//! | `SemaphoreStore` (feature `semaphore`, Linux) | processes on one machine, with Symfony Lock's `SemaphoreStore` (PHP's sysvsem) | yes (in the kernel) | no (a read lock is exclusive) | no | no | yes (the kernel wakes waiters) | by a check | yes (kernel, `SEM_UNDO`) |
//! | [`NullStore`] | no one (locks nothing) | yes (no-op) | yes | no | no | — | — | — |
//!
//! # What a lock does and does not guarantee
//!
//! - It excludes the holders that use the same store (see each store's scope): two holders
//!   never both believe they hold a write lock *according to the store*.
//! - A lost lock is reported: [`release`](Lockable::release) says [`Release::Lost`], a
//!   [`KeepAlive`] and a [`LockGuard`] report it as it is seen, and [`Lock::scoped`] and
//!   [`LockFactory::run`] stop their body and return [`ErrorKind::Lost`]
//!   (`docs/holders-and-loss.md` in the repository says why).
//! - It cannot stop a holder that is paused between its last check and its write: pass the
//!   [fencing token](Lockable::fencing_token) downstream so stale writers can be refused, and
//!   keep ttls well above your pauses.
//! - Locks are not counted: one release lets go for every task of the holder.
//! - Waiters are woken on release, but only etcd and PostgreSQL advisory locks serve them strictly
//!   in order (and queue readers behind a waiting writer). Redis wakes them in the order they
//!   began waiting, yet a newcomer can get in before the one it woke; the other stores wake every
//!   waiter and one wins. Elsewhere readers are preferred (a stream of readers can starve a
//!   writer), as in the peers' layouts.
//! - A dropped guard or cancelled acquire cleans up in the background, ordered before the
//!   holder's next operation, but another holder may see the lock for a moment longer.
//!
//! # Features
//!
//! | feature | what |
//! |---|---|
//! | `flock` (default) | [`FlockStore`]: lock files with `flock(2)`, Linux |
//! | `redis` | `RedisStore`: Redis and Valkey, on redis-rs (tokio, rustls); `RedisPubSubStore`: portalocker's pub/sub lock |
//! | `sql` | `SqlStore`: Symfony's lock table on PostgreSQL, MySQL/MariaDB and SQLite, on sqlx |
//! | `etcd` | `EtcdStore`: etcd's lock recipe, on etcd-client (its build needs `protoc` and the protobuf well-known types) |
//! | `memcached` | `MemcachedStore`: Symfony's Memcached layout, on the meta protocol (memcached ≥ 1.6) |
//! | `semaphore` | `SemaphoreStore`: SysV semaphores in PHP's `sysvsem` layout, Linux |
//! | `metrics` | metrics on the [`metrics`](https://docs.rs/metrics) facade: acquire latency, waits, contention, holds, losses, refresh failures |
//! | `conformance` | the reusable store conformance suite, [`conformance`] |
//! | `test-util` | hooks for this crate's own tests; not a stable API |
//!
//! # Logging
//!
//! With [`tracing`], target `xtr_lock`: successes at debug, contention at info, failures at
//! warn, always with the `resource` field.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod blocking;
mod clock;
pub mod config;
mod election;
// Only the keyword stores in a build without a store that reads a URL.
#[cfg_attr(
    not(any(
        feature = "flock",
        feature = "redis",
        feature = "sql",
        feature = "etcd",
        feature = "memcached"
    )),
    allow(dead_code)
)]
mod dsn;
mod error;
mod holder;
mod key;
mod limits;
mod lock;
mod logging;
mod meta;
mod mode;
mod mutex;
mod permits;
mod redact;
mod report;
mod semaphore;
mod serial;
pub mod store;
mod store_factory;
mod telemetry;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use clock::{BoxFuture, Clock, ManualClock, MonotonicClock};
pub use election::{Election, Leader, Leadership, Observer};
pub use error::{BoxError, Error, ErrorKind, LostReason, Result};
pub use key::{HandleOwner, Key, Mode, validate_token};
pub use limits::MAX_DURATION;
pub use lock::Lock;
pub use lock::factory::{DEFAULT_TTL, LockFactory, RunOptions};
pub use lock::guard::LockGuard;
pub use lock::hold::MAX_HOLD_GRACE;
pub use lock::lockable::{Lockable, NoLock, Release, Wait};
pub use lock::lost::{KeepAlive, LockLost};
pub use lock::policy::OnConflict;
pub use lock::revoke::Revocation;
pub use lock::scope::LockableExt;
pub use meta::MAX_META;
pub use permits::{MAX_PERMITS, Permits};
pub use report::Report;
pub use semaphore::Semaphore;
pub use serial::settle;
#[cfg(feature = "etcd")]
pub use store::EtcdStore;
#[cfg(all(feature = "flock", target_os = "linux"))]
pub use store::FlockStore;
#[cfg(feature = "memcached")]
pub use store::MemcachedStore;
#[cfg(feature = "redis")]
pub use store::RedisPubSubStore;
#[cfg(feature = "redis")]
pub use store::RedisStore;
#[cfg(all(feature = "semaphore", target_os = "linux"))]
pub use store::SemaphoreStore;
pub use store::{InMemoryStore, NullStore, Store, StoreWarning, Usage};
#[cfg(feature = "sql")]
pub use store::{KeyMode, MySqlLockStore, PgAdvisoryStore, SqlStore};
pub use store_factory::{Fencing, QuorumKind, StoreFactory, StoreKind, StoreSpec};
pub use telemetry::{ACQUIRE_SECONDS_BUCKETS, METRICS, MetricInfo, describe_metrics};

/// The README's examples are compiled and run as doc tests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// So are those of `docs/library.md`, the library's page.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
pub struct LibraryPageDoctests;
