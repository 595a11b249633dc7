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
}

impl SymfonyForm {
    pub(crate) fn take(dsn: &Dsn<'_>, options: &mut Options<'_, '_>) -> Result<Self> {
        let cluster = options.flag("redis_cluster")?.unwrap_or(false);
        let sentinel = options.take("redis_sentinel");
        let hosts = options.take_bracketed("host")?;
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
