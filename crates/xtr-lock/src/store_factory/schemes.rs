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
    /// Lower-case schemes (`redis` for `redis://…`) that name it, matched case-insensitively.
    pub schemes: &'static [&'static str],
    /// Colon-less keywords (`flock`, `in-memory`) that name it, matched exactly.
    pub keywords: &'static [&'static str],
    /// A DSN that names it, as help texts show it (`redis://host:6379/0`).
    pub example: &'static str,
    /// What it is, in one line of help text (at most 60 characters).
    pub summary: &'static str,
    /// The cargo feature that builds it (empty: always built).
    pub feature: &'static str,
    /// Whether this build contains it.
    pub built: bool,
    /// How its fencing tokens are counted.
    pub fencing: Fencing,
    /// Whether it keeps tables that `SqlStore::create_table` (and `xtr-lock migrate`) make.
    pub tables: bool,
    /// Whether it has counting semaphores (its stores' `Capabilities::counting`).
    pub counting: bool,
    /// Whether it can list what is held (its stores' `Capabilities::lists`).
    pub lists: bool,
    /// Options whose values are secrets (besides the password), lower-case.
    pub secret_options: &'static [&'static str],
}

/// One row: the schemes (or, for keywords, the exact words) a store answers to.
pub(crate) struct Scheme {
    /// What it is; its schemes and keywords are what DSNs are matched against.
    pub(crate) kind: StoreKind,
    /// Builds the store (never touching the network); `None` when the feature is off.
    pub(crate) build: Option<Build>,
    /// Checks the DSN without building anything; `None` when the feature is off.
    pub(crate) check: Option<Check>,
}

const REDIS: &[&str] = &[
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "valkey+cluster",
    "valkeys+cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "valkey+sentinel",
    "valkeys+sentinel",
];
const PUBSUB: &[&str] = &[
    "redis+pubsub",
    "rediss+pubsub",
    "valkey+pubsub",
    "valkeys+pubsub",
    "unix+pubsub",
];
const ADVISORY: &[&str] = &["postgresql+advisory", "postgres+advisory"];
const GETLOCK: &[&str] = &["mysql+getlock", "mariadb+getlock"];
const SQL: &[&str] = &["postgres", "postgresql", "mysql", "mariadb", "sqlite"];
/// The SQL drivers' options that carry secrets.
const SQL_SECRETS: &[&str] = &["password", "sslkey", "ssl-key"];

type Build = fn(&str) -> Result<Arc<dyn Store>>;
type Check = fn(&str) -> Result<()>;

/// One row: `schemes, keywords, name, example, summary, cfg, fencing, tables, counting, lists,
/// secret options, build, check`. The build and check functions exist only where `cfg` holds (the store is in
/// this build).
macro_rules! row {
    ($schemes:expr, $keywords:expr, $name:literal, $example:literal, $summary:literal,
     $cfg:meta, $fencing:ident, $tables:literal, $counting:literal, $lists:literal,
     $secrets:expr,
     |$d:ident| $build:expr,
     $check:expr) => {{
        #[cfg($cfg)]
        let (build, check): (Option<Build>, Option<Check>) =
            (Some(|$d| Ok(Arc::new($build))), Some($check));
        #[cfg(not($cfg))]
        let (build, check): (Option<Build>, Option<Check>) = (None, None);
        Scheme {
            kind: StoreKind {
                name: $name,
                schemes: $schemes,
                keywords: $keywords,
                example: $example,
                summary: $summary,
                feature: feature_of(stringify!($cfg)),
                built: build.is_some(),
                fencing: Fencing::$fencing,
                tables: $tables,
                counting: $counting,
                lists: $lists,
                secret_options: $secrets,
            },
            build,
            check,
        }
    }};
}

/// The cargo feature a row's `cfg` names (`all(feature = "flock", target_os = "linux")` names
/// `flock`); empty when it names none (`all()`: always built).
fn feature_of(cfg: &'static str) -> &'static str {
    cfg.split_once("feature = \"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or("", |(feature, _)| feature)
}

/// Every store, the default first. No scheme or keyword is in two rows, so the order is the
/// one help texts list them in.
#[rustfmt::skip]
pub(crate) fn table() -> &'static [Scheme] {
    use crate::store as s;
    static TABLE: std::sync::OnceLock<Vec<Scheme>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| vec![
        row!(&["flock"], &["flock"], "flock", "flock:///var/lock/app",
            "lock files, shared with flock(1); `flock`: the default",
            all(feature = "flock", target_os = "linux"), None, false, true, true, &[],
            |d| s::FlockStore::from_dsn(d)?, s::flock::config::validate_dsn),
        row!(REDIS, &[], "redis", "redis://host:6379/0",
            "Redis or Valkey keys with a ttl, shared with Python xtr-lock",
            feature = "redis", PerStore, false, true, true, &[],
            |d| s::RedisStore::from_dsn(d)?, s::redis::validate_dsn),
        row!(PUBSUB, &[], "pubsub", "redis+pubsub://host:6379",
            "a live Redis connection, shared with portalocker",
            feature = "redis", PerResource, false, false, false, &[],
            |d| s::RedisPubSubStore::from_dsn(d)?, s::pubsub::validate_dsn),
        row!(SQL, &[], "sql", "postgres://user@host/db",
            "a lock table, shared with Symfony's PdoStore (`migrate`)",
            feature = "sql", PerResource, true, true, true, SQL_SECRETS,
            |d| s::SqlStore::from_dsn(d)?, s::sql::validate_dsn),
        row!(ADVISORY, &[], "pg-advisory", "postgresql+advisory://user@host/db",
            "PostgreSQL advisory locks, held by a session",
            feature = "sql", None, false, false, false, SQL_SECRETS,
            |d| s::PgAdvisoryStore::from_dsn(d)?, s::advisory::validate_dsn),
        row!(GETLOCK, &[], "mysql-getlock", "mysql+getlock://user@host/db",
            "MySQL/MariaDB GET_LOCK, held by a session",
            feature = "sql", None, false, false, false, SQL_SECRETS,
            |d| s::MySqlLockStore::from_dsn(d)?, s::advisory::validate_dsn),
        row!(&["etcd", "etcds"], &[], "etcd", "etcd://host:2379",
            "etcd's lock recipe on a lease, shared with etcdctl lock",
            feature = "etcd", PerStore, false, true, true, &[],
            |d| s::EtcdStore::from_dsn(d)?, s::etcd::validate_dsn),
        row!(&["memcached"], &[], "memcached", "memcached://host:11211",
            "Memcached entries with a ttl, shared with Symfony Lock",
            feature = "memcached", None, false, true, false, &[],
            |d| s::MemcachedStore::from_dsn(d)?, s::memcached::validate_dsn),
        row!(&[], &["semaphore"], "semaphore", "semaphore",
            "SysV semaphores, shared with PHP's sysvsem (Linux)",
            all(feature = "semaphore", target_os = "linux"), None, false, true, false, &[],
            |_d| s::SemaphoreStore::new(), |_| Ok(())),
        row!(&[], &["in-memory"], "memory", "in-memory",
            "locks in this process only (for tests)",
            all(), PerStore, false, true, true, &[],
            |_d| s::InMemoryStore::new(), |_| Ok(())),
        row!(&[], &["null"], "null", "null",
            "locks nothing: every lock is granted (for tests)",
            all(), None, false, true, false, &[],
            |_d| s::NullStore::new(), |_| Ok(())),
    ])
}

/// The row `dsn` names: by its scheme (case-insensitive) or, without a colon, by keyword.
pub(crate) fn find(dsn: &str) -> Option<&'static Scheme> {
    match dsn.split_once(':') {
        Some((scheme, _)) => {
            let scheme = scheme.to_ascii_lowercase();
            table()
                .iter()
                .find(|r| r.kind.schemes.contains(&scheme.as_str()))
        }
        None => table().iter().find(|r| r.kind.keywords.contains(&dsn)),
    }
}
