//! [`StoreFactory`]: stores from connection strings (DSNs).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::redact::redact;
use crate::store::{CombinedStore, InMemoryStore, NullStore, Store, Strategy};

/// Builds stores from DSNs, so where a lock lives can be configuration.
///
/// | DSN | store |
/// |---|---|
/// | `in-memory` | a **new** [`InMemoryStore`] on each call |
/// | `null` | [`NullStore`] |
/// | `flock`, `flock://` | [`FlockStore`](crate::FlockStore) in the default directory, `<tempdir>/xtr-lock-<uid>` |
/// | `flock://<path>` | [`FlockStore`](crate::FlockStore) in `<path>`, taken literally (`flock:///var/lock/app`); it must be absolute |
/// | `postgres://`, `postgresql://`, `mysql://`, `mariadb://`, `sqlite:///<path>`, `sqlite::memory:` | [`SqlStore`](crate::SqlStore) (feature `sql`) on that database's lock table |
/// | `postgresql+advisory://`, `postgres+advisory://` | [`PgAdvisoryStore`](crate::PgAdvisoryStore) (feature `sql`): session-level advisory locks |
/// | `mysql+getlock://`, `mariadb+getlock://` | [`MySqlLockStore`](crate::MySqlLockStore) (feature `sql`): named locks (`GET_LOCK`) |
/// | `etcd://host:port[,host:port…][/prefix]`, `etcds://` | [`EtcdStore`](crate::EtcdStore) (feature `etcd`): etcd's lock recipe, shared with `etcdctl lock` |
/// | `memcached://host[:port]`, `memcached:///path/to/socket` | [`MemcachedStore`](crate::MemcachedStore) (feature `memcached`): Symfony's Memcached layout |
/// | `semaphore` | [`SemaphoreStore`](crate::SemaphoreStore) (feature `semaphore`, Linux): SysV semaphores in PHP's `sysvsem` layout |
/// | `flock://[<path>]?names=long` | the same, naming files with the whole digest ([`FlockStore::with_long_names`](crate::FlockStore::with_long_names)) |
///
/// Keywords are case-sensitive. Each store issue adds its schemes here (`flock`, `redis://`,
/// …); a known scheme whose store is not in this build is refused saying so.
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
/// assert_eq!(err.to_string(), r#"unsupported connection "memcache:""#);
/// # Ok::<(), xtr_lock::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreFactory;

/// A parsed DSN.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Dsn {
    InMemory,
    Null,
    /// A Redis DSN (checked when parsed).
    #[cfg(feature = "redis")]
    Redis(String),
    /// A Redis pub/sub DSN (checked when parsed).
    #[cfg(feature = "redis")]
    PubSub(String),
    /// An SQL DSN (checked when parsed).
    #[cfg(feature = "sql")]
    Sql(String),
    /// A PostgreSQL advisory-lock DSN (checked when parsed).
    #[cfg(feature = "sql")]
    Advisory(String),
    /// A MySQL `GET_LOCK` DSN (checked when parsed).
    #[cfg(feature = "sql")]
    GetLock(String),
    /// An etcd DSN (checked when parsed).
    #[cfg(feature = "etcd")]
    Etcd(String),
    /// A Memcached DSN (checked when parsed).
    #[cfg(feature = "memcached")]
    Memcached(String),
    /// `semaphore`: SysV semaphores.
    #[cfg_attr(not(all(feature = "semaphore", target_os = "linux")), allow(dead_code))]
    Semaphore,
    /// `flock` or `flock://`: the default directory; `flock://<path>`: that directory; with
    /// `?names=long`, file names with the whole digest.
    #[cfg_attr(not(all(feature = "flock", target_os = "linux")), allow(dead_code))]
    Flock {
        dir: Option<String>,
        long: bool,
    },
}

/// Schemes that name stores this build does not contain yet, with the store's name.
const KNOWN_ELSEWHERE: &[(&str, &str)] = &[
    #[cfg(not(feature = "redis"))]
    ("redis", "redis"),
    #[cfg(not(feature = "redis"))]
    ("rediss", "redis"),
    #[cfg(not(feature = "redis"))]
    ("valkey", "redis"),
    #[cfg(not(feature = "redis"))]
    ("valkeys", "redis"),
    #[cfg(not(feature = "redis"))]
    ("unix", "redis"),
    #[cfg(not(feature = "sql"))]
    ("postgres", "sql"),
    #[cfg(not(feature = "sql"))]
    ("postgresql", "sql"),
    #[cfg(not(feature = "sql"))]
    ("mysql", "sql"),
    #[cfg(not(feature = "sql"))]
    ("mariadb", "sql"),
    #[cfg(not(feature = "sql"))]
    ("sqlite", "sql"),
    #[cfg(not(feature = "sql"))]
    ("postgresql+advisory", "sql"),
    #[cfg(not(feature = "sql"))]
    ("postgres+advisory", "sql"),
    #[cfg(not(feature = "sql"))]
    ("mysql+getlock", "sql"),
    #[cfg(not(feature = "sql"))]
    ("mariadb+getlock", "sql"),
    #[cfg(not(feature = "etcd"))]
    ("etcd", "etcd"),
    #[cfg(not(feature = "etcd"))]
    ("etcds", "etcd"),
    #[cfg(not(feature = "memcached"))]
    ("memcached", "memcached"),
];

impl StoreFactory {
    /// Builds the store `dsn` names. Never touches the network.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a DSN that names no
    /// store, [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) for a store this build
    /// lacks; both show the scheme only.
    pub fn create_store(dsn: &str) -> Result<Arc<dyn Store>> {
        Ok(match parse(dsn)? {
            Dsn::InMemory => Arc::new(InMemoryStore::new()),
            Dsn::Null => Arc::new(NullStore::new()),
            #[cfg(feature = "redis")]
            Dsn::Redis(dsn) => Arc::new(crate::store::RedisStore::from_dsn(&dsn)?),
            #[cfg(feature = "redis")]
            Dsn::PubSub(dsn) => Arc::new(crate::store::RedisPubSubStore::from_dsn(&dsn)?),
            #[cfg(feature = "sql")]
            Dsn::Sql(dsn) => Arc::new(crate::store::SqlStore::from_dsn(&dsn)?),
            #[cfg(feature = "sql")]
            Dsn::Advisory(dsn) => Arc::new(crate::store::PgAdvisoryStore::from_dsn(&dsn)?),
            #[cfg(feature = "sql")]
            Dsn::GetLock(dsn) => Arc::new(crate::store::MySqlLockStore::from_dsn(&dsn)?),
            #[cfg(feature = "etcd")]
            Dsn::Etcd(dsn) => Arc::new(crate::store::EtcdStore::from_dsn(&dsn)?),
            #[cfg(feature = "memcached")]
            Dsn::Memcached(dsn) => Arc::new(crate::store::MemcachedStore::from_dsn(&dsn)?),
            #[cfg(all(feature = "semaphore", target_os = "linux"))]
            Dsn::Semaphore => Arc::new(crate::store::SemaphoreStore::new()),
            #[cfg(not(all(feature = "semaphore", target_os = "linux")))]
            Dsn::Semaphore => {
                return Err(Error::unsupported(
                    "unsupported connection \"semaphore\": this build of xtr-lock has no semaphore store (enable the `semaphore` feature, Linux only)",
                ));
            }
            #[cfg(all(feature = "flock", target_os = "linux"))]
            Dsn::Flock { dir, long } => {
                let store = match dir {
                    None => crate::store::FlockStore::new()?,
                    Some(path) => crate::store::FlockStore::in_dir(path)?,
                };
                Arc::new(if long { store.with_long_names() } else { store })
            }
            #[cfg(not(all(feature = "flock", target_os = "linux")))]
            Dsn::Flock { .. } => {
                return Err(Error::unsupported(
                    "unsupported connection \"flock\": this build of xtr-lock has no flock store (enable the `flock` feature, Linux only)",
                ));
            }
        })
    }

    /// Whether [`create_store`](StoreFactory::create_store) would accept `dsn`, without building
    /// anything.
    ///
    /// # Errors
    ///
    /// The same errors as [`create_store`](StoreFactory::create_store).
    pub fn validate(dsn: &str) -> Result<()> {
        parse(dsn).map(|_| ())
    }
}

fn parse(dsn: &str) -> Result<Dsn> {
    match dsn {
        "in-memory" => return Ok(Dsn::InMemory),
        "null" => return Ok(Dsn::Null),
        "semaphore" => return Ok(Dsn::Semaphore),
        "flock" | "flock://" => {
            return Ok(Dsn::Flock {
                dir: None,
                long: false,
            });
        }
        _ => {}
    }
    #[cfg(feature = "redis")]
    if crate::store::pubsub::is_pubsub_dsn(dsn) {
        crate::store::pubsub::validate_dsn(dsn)?;
        return Ok(Dsn::PubSub(dsn.to_owned()));
    }
    #[cfg(feature = "redis")]
    if crate::store::redis::is_redis_dsn(dsn) {
        crate::store::redis::validate_dsn(dsn)?;
        return Ok(Dsn::Redis(dsn.to_owned()));
    }
    #[cfg(feature = "sql")]
    if crate::store::advisory::is_advisory_dsn(dsn) {
        crate::store::advisory::validate_dsn(dsn)?;
        return Ok(Dsn::Advisory(dsn.to_owned()));
    }
    #[cfg(feature = "sql")]
    if crate::store::advisory::is_getlock_dsn(dsn) {
        crate::store::advisory::validate_dsn(dsn)?;
        return Ok(Dsn::GetLock(dsn.to_owned()));
    }
    #[cfg(feature = "etcd")]
    if crate::store::etcd::is_etcd_dsn(dsn) {
        crate::store::etcd::validate_dsn(dsn)?;
        return Ok(Dsn::Etcd(dsn.to_owned()));
    }
    #[cfg(feature = "memcached")]
    if crate::store::memcached::is_memcached_dsn(dsn) {
        crate::store::memcached::validate_dsn(dsn)?;
        return Ok(Dsn::Memcached(dsn.to_owned()));
    }
    #[cfg(feature = "sql")]
    if crate::store::sql::is_sql_dsn(dsn) {
        crate::store::sql::validate_dsn(dsn)?;
        return Ok(Dsn::Sql(dsn.to_owned()));
    }
    // Everything after `flock://`, taken literally as the Python peer does, except a final
    // `?names=long` or `?names=short` (the file-name mode).
    if let Some(rest) = dsn.strip_prefix("flock://") {
        let (path, long) = match rest.rsplit_once('?') {
            Some((path, "names=long")) => (path, true),
            Some((path, "names=short")) => (path, false),
            Some((_, option)) => {
                return Err(Error::invalid_argument(format!(
                    "invalid flock connection string: unknown option {:?}; the one option is \
                     names=long (or names=short, the default)",
                    option.chars().take(40).collect::<String>()
                )));
            }
            None => (rest, false),
        };
        if path.is_empty() {
            return Ok(Dsn::Flock { dir: None, long });
        }
        if !path.starts_with('/') {
            // Each process would resolve it against its own working directory: two processes
            // started in different directories would silently stop excluding each other.
            return Err(Error::invalid_argument(format!(
                "flock://{:?} names a relative directory, which each process would resolve \
                 against its own working directory: write an absolute path, \
                 flock:///absolute/dir",
                path.chars().take(100).collect::<String>()
            )));
        }
        return Ok(Dsn::Flock {
            dir: Some(path.to_owned()),
            long,
        });
    }
    if dsn.starts_with('/') && !dsn.contains(':') {
        return Err(Error::invalid_argument(format!(
            "unsupported connection {:?}: a path is not a store; flock://{} was probably meant",
            dsn.chars().take(200).collect::<String>(),
            dsn.chars().take(200).collect::<String>()
        )));
    }
    let scheme = dsn.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    let keyword = scheme.as_deref().unwrap_or(dsn);
    if let Some((_, store)) = KNOWN_ELSEWHERE.iter().find(|(s, _)| *s == keyword) {
        // `flock` is case-sensitive like the other keywords; schemes with a colon are not.
        if scheme.is_some() || keyword == dsn {
            return Err(Error::unsupported(format!(
                "unsupported connection {}: this build of xtr-lock has no {store} store",
                redact(dsn)
            )));
        }
    }
    Err(Error::invalid_argument(format!(
        "unsupported connection {}",
        redact(dsn)
    )))
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
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn keywords_build_their_stores() {
        assert_eq!(parse("in-memory").unwrap(), Dsn::InMemory);
        assert_eq!(parse("null").unwrap(), Dsn::Null);
        let a = StoreFactory::create_store("in-memory").unwrap();
        assert_eq!(a.to_string(), "in-memory");
        assert_eq!(
            StoreFactory::create_store("null").unwrap().to_string(),
            "null"
        );
    }

    #[test]
    fn refusals_name_the_scheme_only() {
        let memcached_kind = if cfg!(feature = "memcached") {
            ErrorKind::InvalidArgument
        } else {
            ErrorKind::Unsupported
        };
        let cases: &[(&str, ErrorKind, &str)] = &[
            // With the store built, a credential is refused (no SASL); without it, the store
            // is missing. Either way the scheme is all that is shown.
            (
                "memcached://user:secret@db:11211",
                memcached_kind,
                "\"memcached:\"",
            ),
            (
                "MEMCACHED://user:secret@db:11211",
                memcached_kind,
                "MEMCACHED:\"",
            ),
            ("FLOCK", ErrorKind::InvalidArgument, "\"FLOCK\""),
            ("IN-MEMORY", ErrorKind::InvalidArgument, "\"IN-MEMORY\""),
            ("SEMAPHORE", ErrorKind::InvalidArgument, "\"SEMAPHORE\""),
            (
                "my_redis_service",
                ErrorKind::InvalidArgument,
                "\"my_redis_service\"",
            ),
            ("memcache://h", ErrorKind::InvalidArgument, "\"memcache:\""),
            ("", ErrorKind::InvalidArgument, "redacted"),
            (
                "hunter2 pasted secret",
                ErrorKind::InvalidArgument,
                "redacted",
            ),
            ("user:pa ss@host", ErrorKind::InvalidArgument, "\"user:\""),
            ("p@ss:word", ErrorKind::InvalidArgument, "redacted"),
        ];
        for (dsn, kind, shown) in cases {
            let err = StoreFactory::create_store(dsn).unwrap_err();
            let msg = err.to_string();
            assert_eq!(err.kind(), *kind, "{dsn}: {msg}");
            assert!(msg.contains(shown), "{dsn}: {msg}");
            for secret in ["secret", "pw@", "hunter2", "pa ss", "word"] {
                assert!(!msg.contains(secret), "{dsn}: {msg}");
            }
            // validate refuses exactly what create_store refuses.
            assert_eq!(StoreFactory::validate(dsn).unwrap_err().kind(), *kind);
        }
        assert!(StoreFactory::validate("in-memory").is_ok());
        assert!(StoreFactory::validate("null").is_ok());
    }

    #[test]
    fn flock_dsns_name_the_directory_literally() {
        let flock = |dir: Option<&str>, long| Dsn::Flock {
            dir: dir.map(str::to_owned),
            long,
        };
        assert_eq!(parse("flock").unwrap(), flock(None, false));
        assert_eq!(parse("flock://").unwrap(), flock(None, false));
        assert_eq!(
            parse("flock:///var/lock/app").unwrap(),
            flock(Some("/var/lock/app"), false)
        );
        let err = parse("flock://rel/dir").unwrap_err();
        assert!(err.is_invalid_argument());
        assert!(err.to_string().contains("relative directory"), "{err}");
        assert_eq!(
            parse("flock:///a%20b").unwrap(),
            flock(Some("/a%20b"), false),
            "no decoding"
        );
        let err = parse("flock:///var/lock?names=lng").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid flock connection string: unknown option \"names=lng\"; the one option is \
             names=long (or names=short, the default)"
        );
        let err = parse("/var/lock").unwrap_err();
        assert!(
            err.to_string()
                .contains("a path is not a store; flock:///var/lock was probably meant"),
            "{err}"
        );
        assert_eq!(
            parse("flock:///var/lock/app?names=long").unwrap(),
            flock(Some("/var/lock/app"), true)
        );
        assert_eq!(parse("flock://?names=long").unwrap(), flock(None, true));
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_dsns_build_redis_stores_without_touching_the_network() {
        let store = StoreFactory::create_store("redis://:pw@localhost:1/0?prefix=app:").unwrap();
        assert_eq!(store.to_string(), "redis://localhost:1/0");
        assert!(store.capabilities().expiring);
        let err = StoreFactory::validate("redis://:pw@localhost:notaport").unwrap_err();
        assert!(!err.to_string().contains("pw"), "{err}");
    }

    #[test]
    fn in_memory_gives_a_new_store_each_time() {
        let a = StoreFactory::create_store("in-memory").unwrap();
        let b = StoreFactory::create_store("in-memory").unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
    }
}
