//! The scheme table: one row per store, read by everything that turns a connection string into
//! a store or says something about one (building, validation, "not in this build", `config
//! check`, redaction, the CLI's fencing text and `migrate`).
//!
//! Adding a store is one module plus one row here (the checklist is in `docs/store-trait.md`).

use std::sync::Arc;

use crate::error::Result;
use crate::store::Store;

/// How a store's fencing tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// One counter per resource.
    PerResource,
    /// One counter for every resource of the store.
    PerStore,
    /// No fencing tokens.
    None,
}

/// What the library knows about a kind of store, by its DSN (see [`StoreFactory::kind`](crate::StoreFactory::kind)).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct StoreKind {
    /// The store's short name (`redis`, `sql`, `flock`), as in its tokens and metrics.
    pub name: &'static str,
    /// The cargo feature that builds it (empty: always built).
    pub feature: &'static str,
    /// Whether this build contains it.
    pub built: bool,
    /// How its fencing tokens are counted.
    pub fencing: Fencing,
    /// Whether it keeps tables that `SqlStore::create_table` (and `xtr-lock migrate`) make.
    pub tables: bool,
    /// Options whose values are secrets (besides the password), lower-case.
    pub secret_options: &'static [&'static str],
}

/// One row: the schemes (or, for keywords, the exact words) a store answers to.
pub(crate) struct Scheme {
    /// Lower-case schemes (`redis` for `redis://…`), matched case-insensitively.
    pub(crate) schemes: &'static [&'static str],
    /// Colon-less keywords (`flock`, `in-memory`), matched exactly (case-sensitive).
    pub(crate) keywords: &'static [&'static str],
    pub(crate) kind: StoreKind,
    /// Builds the store (never touching the network); `None` when the feature is off.
    pub(crate) build: Option<fn(&str) -> Result<Arc<dyn Store>>>,
    /// Checks the DSN without building anything; `None` when the feature is off.
    pub(crate) check: Option<fn(&str) -> Result<()>>,
}

const fn kind(
    name: &'static str,
    feature: &'static str,
    built: bool,
    fencing: Fencing,
) -> StoreKind {
    StoreKind {
        name,
        feature,
        built,
        fencing,
        tables: false,
        secret_options: &[],
    }
}

const REDIS_SCHEMES: &[&str] = &["redis", "rediss", "valkey", "valkeys", "unix"];
const PUBSUB_SCHEMES: &[&str] = &[
    "redis+pubsub",
    "rediss+pubsub",
    "valkey+pubsub",
    "valkeys+pubsub",
    "unix+pubsub",
];
/// The SQL drivers' options that carry secrets.
const SQL_SECRETS: &[&str] = &["password", "sslkey", "ssl-key"];

macro_rules! built {
    ($cfg:meta, $build:expr, $check:expr) => {{
        #[cfg($cfg)]
        let pair: (
            Option<fn(&str) -> Result<Arc<dyn Store>>>,
            Option<fn(&str) -> Result<()>>,
        ) = (Some($build), Some($check));
        #[cfg(not($cfg))]
        let pair: (
            Option<fn(&str) -> Result<Arc<dyn Store>>>,
            Option<fn(&str) -> Result<()>>,
        ) = (None, None);
        pair
    }};
}

/// Every store, in the order DSNs are matched.
pub(crate) fn table() -> &'static [Scheme] {
    static TABLE: std::sync::OnceLock<Vec<Scheme>> = std::sync::OnceLock::new();
    TABLE.get_or_init(rows)
}

fn row(
    schemes: &'static [&'static str],
    keywords: &'static [&'static str],
    kind: StoreKind,
    (build, check): (
        Option<fn(&str) -> Result<Arc<dyn Store>>>,
        Option<fn(&str) -> Result<()>>,
    ),
) -> Scheme {
    Scheme {
        schemes,
        keywords,
        kind: StoreKind {
            built: build.is_some(),
            ..kind
        },
        build,
        check,
    }
}

#[allow(clippy::too_many_lines)] // one row per store, each a few lines
fn rows() -> Vec<Scheme> {
    use Fencing::{None as NoFencing, PerResource, PerStore};
    vec![
        row(
            &[],
            &["in-memory"],
            kind("memory", "", true, PerStore),
            (
                Some(|_| Ok(Arc::new(crate::store::InMemoryStore::new()))),
                Some(|_| Ok(())),
            ),
        ),
        row(
            &[],
            &["null"],
            kind("null", "", true, NoFencing),
            (
                Some(|_| Ok(Arc::new(crate::store::NullStore::new()))),
                Some(|_| Ok(())),
            ),
        ),
        row(
            &[],
            &["semaphore"],
            kind("semaphore", "semaphore", true, NoFencing),
            built!(
                all(feature = "semaphore", target_os = "linux"),
                |_| Ok(Arc::new(crate::store::SemaphoreStore::new())),
                |_| Ok(())
            ),
        ),
        row(
            &["flock"],
            &["flock"],
            kind("flock", "flock", true, NoFencing),
            built!(
                all(feature = "flock", target_os = "linux"),
                |d| Ok(Arc::new(crate::store::FlockStore::from_dsn(d)?)),
                |d| crate::store::flock::config::validate_dsn(d)
            ),
        ),
        row(
            PUBSUB_SCHEMES,
            &[],
            StoreKind {
                secret_options: &[],
                ..kind("pubsub", "redis", true, PerResource)
            },
            built!(
                feature = "redis",
                |d| Ok(Arc::new(crate::store::RedisPubSubStore::from_dsn(d)?)),
                |d| crate::store::pubsub::validate_dsn(d)
            ),
        ),
        row(
            REDIS_SCHEMES,
            &[],
            kind("redis", "redis", true, PerStore),
            built!(
                feature = "redis",
                |d| Ok(Arc::new(crate::store::RedisStore::from_dsn(d)?)),
                |d| crate::store::redis::validate_dsn(d)
            ),
        ),
        row(
            &["postgresql+advisory", "postgres+advisory"],
            &[],
            StoreKind {
                secret_options: SQL_SECRETS,
                ..kind("pg-advisory", "sql", true, NoFencing)
            },
            built!(
                feature = "sql",
                |d| Ok(Arc::new(crate::store::PgAdvisoryStore::from_dsn(d)?)),
                |d| crate::store::advisory::validate_dsn(d)
            ),
        ),
        row(
            &["mysql+getlock", "mariadb+getlock"],
            &[],
            StoreKind {
                secret_options: SQL_SECRETS,
                ..kind("mysql-getlock", "sql", true, NoFencing)
            },
            built!(
                feature = "sql",
                |d| Ok(Arc::new(crate::store::MySqlLockStore::from_dsn(d)?)),
                |d| crate::store::advisory::validate_dsn(d)
            ),
        ),
        row(
            &["etcd", "etcds"],
            &[],
            kind("etcd", "etcd", true, PerStore),
            built!(
                feature = "etcd",
                |d| Ok(Arc::new(crate::store::EtcdStore::from_dsn(d)?)),
                |d| crate::store::etcd::validate_dsn(d)
            ),
        ),
        row(
            &["memcached"],
            &[],
            kind("memcached", "memcached", true, NoFencing),
            built!(
                feature = "memcached",
                |d| Ok(Arc::new(crate::store::MemcachedStore::from_dsn(d)?)),
                |d| crate::store::memcached::validate_dsn(d)
            ),
        ),
        row(
            &["postgres", "postgresql", "mysql", "mariadb", "sqlite"],
            &[],
            StoreKind {
                tables: true,
                secret_options: SQL_SECRETS,
                ..kind("sql", "sql", true, PerResource)
            },
            built!(
                feature = "sql",
                |d| Ok(Arc::new(crate::store::SqlStore::from_dsn(d)?)),
                |d| crate::store::sql::validate_dsn(d)
            ),
        ),
    ]
}

/// The row `dsn` names: by its scheme (case-insensitive) or, without a colon, by keyword.
pub(crate) fn find(dsn: &str) -> Option<&'static Scheme> {
    match dsn.split_once(':') {
        Some((scheme, _)) => {
            let scheme = scheme.to_ascii_lowercase();
            table()
                .iter()
                .find(|r| r.schemes.contains(&scheme.as_str()))
        }
        None => table().iter().find(|r| r.keywords.contains(&dsn)),
    }
}
