//! [`StoreFactory`]: stores from connection strings (DSNs), through one grammar
//! ([`crate::dsn`], below the stores) and one table of schemes ([`schemes`]).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::redact::redact;
use crate::store::{CombinedStore, Store, Strategy};

pub(crate) mod schemes;
mod spec;

pub use schemes::{Fencing, StoreKind};
pub use spec::{QuorumKind, StoreSpec};

/// Builds stores from DSNs, so where a lock lives can be configuration.
///
/// | DSN | store |
/// |---|---|
/// | `in-memory` | a **new** [`InMemoryStore`](crate::InMemoryStore) on each call |
/// | `null` | [`NullStore`](crate::NullStore) |
/// | `flock`, `flock://` | [`FlockStore`](crate::FlockStore) in the default directory, `<tempdir>/xtr-lock-<uid>` |
/// | `flock://<path>` | [`FlockStore`](crate::FlockStore) in `<path>`, taken literally (`flock:///var/lock/app`); it must be absolute |
/// | `redis://[user[:password]@]host[:port][/db]`, `rediss://` (TLS), `valkey://`, `valkeys://`, `unix:///path/to/socket[?db=N]` | [`RedisStore`](crate::RedisStore) (feature `redis`): the sorted-set layout shared with Python xtr-lock and Symfony Lock; `?prefix=`, `?socket_timeout=`, `?socket_connect_timeout=` |
/// | `redis+cluster://h1:p1,h2:p2`, `redis+sentinel://s1:26379,s2:26379/<master>[/db]` (and their `rediss`, `valkey`, `valkeys` forms; Symfony's `redis:?host[h:p]&redis_cluster=1`, `redis_sentinel=<master>`) | [`RedisStore`](crate::RedisStore) (feature `redis`) on a Redis Cluster or Sentinel's master; also `?wait_replicas=N&wait_timeout=` |
/// | `redis+pubsub://`, `rediss+pubsub://`, `valkey+pubsub://`, `valkeys+pubsub://`, `unix+pubsub://` | [`RedisPubSubStore`](crate::RedisPubSubStore) (feature `redis`): portalocker's pub/sub lock, a live subscription per holder; `?unavailable_timeout=`, `?check_interval=`, `?health_check_interval=` |
/// | `postgres://`, `postgresql://`, `mysql://`, `mariadb://`, `sqlite:///<path>`, `sqlite::memory:` | [`SqlStore`](crate::SqlStore) (feature `sql`) on that database's lock table |
/// | `postgresql+advisory://`, `postgres+advisory://` | [`PgAdvisoryStore`](crate::PgAdvisoryStore) (feature `sql`): session-level advisory locks |
/// | `mysql+getlock://`, `mariadb+getlock://` | [`MySqlLockStore`](crate::MySqlLockStore) (feature `sql`): named locks (`GET_LOCK`) |
/// | `etcd://host:port[,host:port…][/prefix]`, `etcds://` | [`EtcdStore`](crate::EtcdStore) (feature `etcd`): etcd's lock recipe, shared with `etcdctl lock` |
/// | `memcached://host[:port]`, `memcached:///path/to/socket` | [`MemcachedStore`](crate::MemcachedStore) (feature `memcached`): Symfony's Memcached layout |
/// | `semaphore` | [`SemaphoreStore`](crate::SemaphoreStore) (feature `semaphore`, Linux): SysV semaphores in PHP's `sysvsem` layout |
/// | `flock://[<path>]?names=long` | the same, naming files with the whole digest ([`FlockStore::with_long_names`](crate::FlockStore::with_long_names)) |
///
/// Keywords are case-sensitive, schemes are not. A known scheme whose store is not in this build
/// is refused saying so.
///
/// Errors never echo a credential: a refused DSN is shown as its scheme and colon only
/// (`memcache:`), and a colon-less input is echoed only when it looks like a keyword.
///
/// # Examples
///
/// ```
/// let store = xtr_lock::StoreFactory::create_store("in-memory")?;
/// assert_eq!(store.to_string(), "in-memory");
/// let err = xtr_lock::StoreFactory::validate("memcache://app:hunter2@cache:11211").unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     r#"unsupported connection "memcache:"; did you mean "memcached:"?"#
/// );
/// # Ok::<(), xtr_lock::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreFactory;

impl StoreFactory {
    /// Builds the store `dsn` names. Never touches the network.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a DSN that names no
    /// store, [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) for a store this build
    /// lacks; both show the scheme only.
    pub fn create_store(dsn: &str) -> Result<Arc<dyn Store>> {
        let row = row(dsn)?;
        let build = row.build.ok_or_else(|| not_built(dsn, row))?;
        build(dsn)
    }

    /// Whether [`create_store`](StoreFactory::create_store) would accept `dsn`, without building
    /// anything.
    ///
    /// # Errors
    ///
    /// The same errors as [`create_store`](StoreFactory::create_store).
    pub fn validate(dsn: &str) -> Result<()> {
        let row = row(dsn)?;
        let check = row.check.ok_or_else(|| not_built(dsn, row))?;
        check(dsn)
    }

    /// What kind of store `dsn` names (by its scheme or keyword alone; the rest is not checked),
    /// whether or not this build contains it.
    pub fn kind(dsn: &str) -> Option<StoreKind> {
        schemes::find(dsn).map(|r| r.kind)
    }

    /// Every kind of store the library knows, the default (flock) first, with whether this
    /// build contains it ([`StoreKind::built`]): for help texts that list the stores.
    ///
    /// ```
    /// let redis = xtr_lock::StoreFactory::kinds().find(|k| k.name == "redis").unwrap();
    /// assert_eq!(redis.example, "redis://host:6379/0");
    /// assert!(redis.schemes.contains(&"rediss"));
    /// ```
    pub fn kinds() -> impl Iterator<Item = StoreKind> {
        schemes::table().iter().map(|r| r.kind)
    }

    /// `dsn` as it may be shown (`config show`): the password, a Redis user name alone (which
    /// Redis takes as the password) and secret options replaced by `***`; a DSN that is not a
    /// URL shows its scheme only.
    pub fn redact(dsn: &str) -> String {
        let kind = Self::kind(dsn);
        // Redis takes a lone user name as the password.
        let lone_user_is_secret = kind.is_some_and(|k| matches!(k.name, "redis" | "pubsub"));
        let secrets = kind.map_or(&[][..], |k| k.secret_options);
        crate::redact::redact_dsn(dsn, secrets, lone_user_is_secret)
    }
}

/// The row `dsn` names, or the error saying it names none.
fn row(dsn: &str) -> Result<&'static schemes::Scheme> {
    if let Some(row) = schemes::find(dsn) {
        return Ok(row);
    }
    if dsn.starts_with('/') && !dsn.contains(':') {
        return Err(Error::invalid_argument(format!(
            "unsupported connection {:?}: a path is not a store; flock://{} was probably meant",
            dsn.chars().take(200).collect::<String>(),
            dsn.chars().take(200).collect::<String>()
        )));
    }
    let meant = dsn
        .split_once(':')
        .and_then(|(scheme, _)| closest_scheme(scheme));
    Err(Error::invalid_argument(match meant {
        Some(known) => format!(
            "unsupported connection {}; did you mean \"{known}:\"?",
            redact(dsn)
        ),
        None => format!("unsupported connection {}", redact(dsn)),
    }))
}

/// The known scheme a mistyped one most likely meant (`redsi` → `redis`, `memcache` →
/// `memcached`): at most two edits away, and not itself a secret (it is only shown when
/// [`redact`] would show the scheme anyway).
fn closest_scheme(scheme: &str) -> Option<&'static str> {
    let scheme = scheme.to_ascii_lowercase();
    schemes::table()
        .iter()
        .flat_map(|r| r.kind.schemes.iter().copied())
        .map(|known| (crate::dsn::edits(&scheme, known), known))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, known)| known)
}

fn not_built(dsn: &str, row: &schemes::Scheme) -> Error {
    let linux = if matches!(row.kind.feature, "flock" | "semaphore") {
        ", Linux only"
    } else {
        ""
    };
    Error::unsupported(format!(
        "unsupported connection {}: this build of xtr-lock has no {} store (enable the `{}` \
         feature{linux})",
        redact(dsn),
        row.kind.name,
        row.kind.feature
    ))
}

impl CombinedStore {
    /// A store over the stores `dsns` name (see [`StoreFactory`]).
    ///
    /// # Errors
    ///
    /// The first DSN that names no store, showing its scheme only; or no DSN at all.
    pub fn from_dsns(dsns: &[&str], strategy: impl Strategy) -> Result<Self> {
        let stores = dsns
            .iter()
            .map(|d| StoreFactory::create_store(d))
            .collect::<Result<Vec<_>>>()?;
        Self::new(stores, strategy)
    }
}

#[cfg(test)]
mod tests;
