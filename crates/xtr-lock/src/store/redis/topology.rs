//! Where a Redis store's server is: one server, a Redis Cluster (`redis+cluster://h1:p1,h2:p2`,
//! or Symfony's `redis:?host[h1:p1]&host[h2:p2]&redis_cluster=1`), or a master found through
//! Sentinel (`redis+sentinel://s1:26379,s2:26379/<master>/<db>`, or Symfony's
//! `redis:?host[s1:26379]&redis_sentinel=<master>`); and how many replicas must confirm a write
//! (`wait_replicas`).

use std::time::Duration;

use crate::dsn::{Dsn, Options, host_port};
use crate::error::Result;

/// The default port of a Sentinel.
const SENTINEL_PORT: u16 = 26379;

/// How long a write waits for its replicas by default (`wait_timeout`).
pub(crate) const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);

/// The most replicas a DSN may ask to wait for.
const MAX_REPLICAS: u32 = 64;

/// The kind of deployment a scheme or Symfony's options name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Single,
    Cluster,
    Sentinel,
}

/// The servers a store talks to (client URLs: may hold credentials, never shown).
#[derive(Clone)]
pub(crate) enum Topology {
    /// One server, at the config's client URL.
    Single,
    /// A cluster: its seed nodes (every node of one cluster).
    Cluster { nodes: Vec<String> },
    /// The master Sentinel names `master`, in database `db`, reached with the credentials of
    /// `node` (a URL without host: `redis://user:pass@_/db`).
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        db: u32,
        user: String,
        password: Option<String>,
        tls: bool,
    },
}

/// A write counts once this many replicas confirm it (`WAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Durability {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// `redis+cluster` → (`redis`, cluster); other schemes are single servers.
pub(crate) fn split_scheme(scheme: &str) -> (&str, Kind) {
    if let Some(base) = scheme.strip_suffix("+cluster") {
        (base, Kind::Cluster)
    } else if let Some(base) = scheme.strip_suffix("+sentinel") {
        (base, Kind::Sentinel)
    } else {
        (scheme, Kind::Single)
    }
}

/// Symfony's way of naming a cluster or Sentinel on a plain `redis:` DSN: `redis_cluster=1`,
/// `redis_sentinel=<master>`, and `host[h:p]` options beside (or instead of) the authority.
pub(crate) struct SymfonyForm {
    pub(crate) cluster: bool,
    pub(crate) sentinel: Option<String>,
    pub(crate) hosts: Vec<String>,
    /// The credentials of `redis:[[user:]password@]?…` (no `//`) or `auth=`/`auth[]=`.
    pub(crate) credentials: Option<(String, Option<String>)>,
    /// `dbindex=`: the database.
    pub(crate) dbindex: Option<String>,
    /// `timeout=` (connecting) and `read_timeout=` (answers); 0 leaves the default.
    pub(crate) timeout: Option<Duration>,
    pub(crate) read_timeout: Option<Duration>,
}

/// Symfony's connection options that tune its PHP client (persistent connections, lazy
/// connecting, which class, replica reads) and have no meaning here: accepted and dropped, so
/// one DSN serves both.
const SYMFONY_CLIENT_OPTIONS: &[&str] = &[
    "class",
    "persistent",
    "persistent_id",
    "retry_interval",
    "tcp_keepalive",
    "lazy",
    "failover",
];

impl SymfonyForm {
    pub(crate) fn take(dsn: &Dsn<'_>, options: &mut Options<'_, '_>) -> Result<Self> {
        let cluster = options.flag("redis_cluster")?.unwrap_or(false);
        let sentinel = options.take("redis_sentinel");
        let hosts = options.take_bracketed("host")?;
        let credentials = symfony_credentials(dsn, options)?;
        let dbindex = options.take("dbindex");
        let timeout = php_seconds(dsn, options, "timeout")?;
        let read_timeout = php_seconds(dsn, options, "read_timeout")?;
        options.ignore(SYMFONY_CLIENT_OPTIONS);
        if cluster && sentinel.is_some() {
            return Err(dsn.invalid("redis_cluster and redis_sentinel exclude each other"));
        }
        if sentinel.as_deref() == Some("") {
            return Err(dsn.invalid("redis_sentinel needs the master's name"));
        }
        Ok(SymfonyForm {
            cluster,
            sentinel,
            hosts,
            credentials,
            dbindex,
            timeout,
            read_timeout,
        })
    }

    /// The kind these options name on top of the scheme's.
    pub(crate) fn kind(&self, dsn: &Dsn<'_>, scheme: Kind) -> Result<Kind> {
        let named = if self.cluster {
            Kind::Cluster
        } else if self.sentinel.is_some() {
            Kind::Sentinel
        } else {
            Kind::Single
        };
        match (scheme, named) {
            (k, Kind::Single) => Ok(k),
            (Kind::Single, k) => Ok(k),
            (a, b) if a == b => Ok(a),
            _ => Err(dsn.invalid("the scheme and redis_cluster/redis_sentinel disagree")),
        }
    }
}

/// The credentials Symfony's forms give: `redis:[[user:]password@]?host[…]` (without `//`,
/// where a lone value is the password, as Symfony reads it), `auth=<password>` or
/// `auth[]=<user>&auth[]=<password>`. `None` when there are none; an error when two are given.
fn symfony_credentials(
    dsn: &Dsn<'_>,
    options: &mut Options<'_, '_>,
) -> Result<Option<(String, Option<String>)>> {
    let mut found = Vec::new();
    if dsn.url.is_none() {
        let before = dsn.rest.split(['?', '#']).next().unwrap_or_default();
        if !before.is_empty() {
            let Some(userinfo) = before.strip_suffix('@') else {
                return Err(dsn.invalid(
                    "expected \"redis://host\" or Symfony's \"redis:?host[…]\" (with \
                     \"[[user:]password@]\" before the \"?\")",
                ));
            };
            found.push(match userinfo.split_once(':') {
                Some((user, pw)) => (
                    dsn.decode("user name", user)?,
                    Some(dsn.decode("password", pw)?),
                ),
                None => (String::new(), Some(dsn.decode("password", userinfo)?)),
            });
        }
    }
    if let Some(pw) = options.take("auth") {
        found.push((String::new(), Some(pw)));
    }
    match options.take_all("auth[]").as_slice() {
        [] => {}
        [pw] => found.push((String::new(), Some(pw.clone()))),
        [user, pw] => found.push((user.clone(), Some(pw.clone()))),
        _ => return Err(dsn.invalid("auth[] is given as a user name and a password, at most")),
    }
    let mut found = found.into_iter();
    let first = found.next();
    if found.next().is_some() {
        return Err(dsn.invalid("the credentials are given twice (before ?, auth=, auth[]=)"));
    }
    Ok(first)
}

/// Symfony's timeouts: seconds, possibly fractional; 0 (none, to PHP) leaves ours as it is.
fn php_seconds(
    dsn: &Dsn<'_>,
    options: &mut Options<'_, '_>,
    name: &'static str,
) -> Result<Option<Duration>> {
    let Some(text) = options.take(name) else {
        return Ok(None);
    };
    match text.parse::<f64>() {
        Ok(0.0) => Ok(None),
        _ => crate::limits::positive_seconds(&text, Duration::from_secs(86_400))
            .map(Some)
            .ok_or_else(|| {
                dsn.invalid(format!(
                    "{name} must be a number of seconds from 0 to 86400"
                ))
            }),
    }
}

/// `h1:p1,h2:p2` (and Symfony's `host[…]` options): each as `host:port`, `default` when no port.
pub(crate) fn host_list(
    dsn: &Dsn<'_>,
    hosts: &str,
    extra: &[String],
    default: u16,
) -> Result<Vec<(String, u16)>> {
    let mut out = Vec::new();
    for text in hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .chain(extra.iter().map(String::as_str))
    {
        let (host, port) = host_port(dsn, text, default)?;
        out.push((host.to_owned(), port));
    }
    if out.is_empty() {
        return Err(dsn.invalid("missing host"));
    }
    Ok(out)
}

/// A cluster's or Sentinel's path: empty or `0` for a cluster (one database); `<master>[/<db>]`
/// for Sentinel (the master's name may also come from `redis_sentinel`).
pub(crate) fn sentinel_path(
    dsn: &Dsn<'_>,
    path: &str,
    named: Option<String>,
    db: Option<String>,
) -> Result<(String, u32)> {
    let (master, db_in_path) = match path.split_once('/') {
        Some((m, d)) => (m, Some(d)),
        None => (path, None),
    };
    let master = match (dsn.decode("master name", master)?, named) {
        (m, Some(n)) if m.is_empty() || m == n => n,
        (m, None) if !m.is_empty() => m,
        (_, Some(_)) => return Err(dsn.invalid("the path and redis_sentinel name two masters")),
        _ => {
            return Err(dsn.invalid(
                "Sentinel needs the master's name (redis+sentinel://s1:26379,s2:26379/mymaster/0)",
            ));
        }
    };
    let db = db
        .as_deref()
        .or(db_in_path.filter(|d| !d.is_empty()))
        .unwrap_or("0")
        .parse::<u32>()
        .map_err(|_| dsn.invalid("the database must be a number"))?;
    Ok((master, db))
}

/// The default port of the servers a kind lists.
pub(crate) fn default_port(kind: Kind) -> u16 {
    if kind == Kind::Sentinel {
        SENTINEL_PORT
    } else {
        6379
    }
}

/// `wait_replicas=N` and `wait_timeout=<seconds>`.
pub(crate) fn durability(
    dsn: &Dsn<'_>,
    options: &mut Options<'_, '_>,
    max_timeout: Duration,
) -> Result<Option<Durability>> {
    let replicas = options.number::<u32>("wait_replicas", 0..=MAX_REPLICAS)?;
    let timeout = options.seconds("wait_timeout", max_timeout)?;
    match (replicas, timeout) {
        (Some(0) | None, Some(_)) => Err(dsn.invalid("wait_timeout needs wait_replicas")),
        (Some(0) | None, None) => Ok(None),
        (Some(n), t) => Ok(Some(Durability {
            replicas: n,
            timeout: t.unwrap_or(DEFAULT_WAIT_TIMEOUT),
        })),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Topology;
    use crate::store::redis::config::parse;

    /// Symfony's own DSN examples (its `RedisTrait`), read as Symfony reads them.
    #[test]
    fn symfony_credentials_database_and_client_options_are_read() {
        let c = parse("redis:secret@?host[a:7000]&host[b:7001]&redis_cluster=1").unwrap();
        let Topology::Cluster { nodes } = &c.topology else {
            panic!("not a cluster")
        };
        assert_eq!(nodes[0], "redis://:secret@a:7000/0");
        let c = parse("redis:?host[a:7000]&host[b]&auth=p%40ss&redis_cluster=1&lazy=1").unwrap();
        let Topology::Cluster { nodes } = &c.topology else {
            panic!("not a cluster")
        };
        assert_eq!(nodes[1], "redis://:p%40ss@b:6379/0");
        let c = parse("redis:?host[a]&auth[]=app&auth[]=pw&redis_cluster=on").unwrap();
        let Topology::Cluster { nodes } = &c.topology else {
            panic!("not a cluster")
        };
        assert_eq!(nodes[0], "redis://app:pw@a:6379/0");
        let s = parse(
            "redis:u:pw@?host[s1:26379]&redis_sentinel=mymaster&dbindex=3&timeout=2.5\
             &read_timeout=0&persistent=1&retry_interval=100&tcp_keepalive=60",
        )
        .unwrap();
        let Topology::Sentinel {
            db, user, password, ..
        } = &s.topology
        else {
            panic!("not Sentinel")
        };
        assert_eq!(
            (*db, user.as_str(), password.as_deref()),
            (3, "u", Some("pw"))
        );
        assert_eq!(s.connect_timeout, Duration::from_millis(2500));
        let one = parse("redis:secret@?host[h:6380]&dbindex=2&read_timeout=0.5").unwrap();
        assert_eq!(one.client_url, "redis://:secret@h:6380/2");
        assert_eq!(one.response_timeout, Duration::from_millis(500));
    }

    #[test]
    fn symfony_credentials_given_twice_or_misplaced_are_refused_without_showing_them() {
        for (dsn, says) in [
            ("redis://u:pw@h?auth=other", "twice"),
            ("redis:pw@?host[h]&auth=other", "twice"),
            ("redis:secretvalue?host[h]", "before the"),
            ("redis:?host[h]&auth[]=a&auth[]=b&auth[]=c", "at most"),
            ("redis:?host[h]&timeout=soon", "timeout"),
            ("redis://h/2?dbindex=3", "dbindex disagrees"),
            ("redis://h?db=1&dbindex=3", "dbindex disagrees"),
        ] {
            let err = parse(dsn).unwrap_err().to_string();
            assert!(err.contains(says), "{dsn}: {err}");
            for secret in ["pw", "other", "secretvalue"] {
                assert!(!err.contains(secret), "{dsn}: {err}");
            }
        }
    }
}
