//! Redis DSNs: `redis://`, `rediss://` (TLS), `valkey://`, `valkeys://`, `unix://`, with the
//! options the Python peer reads (`prefix`, `socket_timeout`, `socket_connect_timeout`, `db`).

use std::fmt;
use std::time::Duration;

use super::topology::{
    Durability, Kind, SymfonyForm, Topology, default_port, durability, host_list, sentinel_path,
    split_scheme,
};
use crate::dsn::{Dsn, Options, UrlParts, host_port};
use crate::error::{Error, Result};

/// Default connect and read/write timeouts, as the Python peer's.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A parsed Redis DSN. Its `Debug` and `Display` never show credentials.
#[derive(Clone)]
pub(crate) struct RedisConfig {
    /// The URL handed to redis-rs (may hold credentials: never shown).
    pub(crate) client_url: String,
    /// A credential-free description: `redis://host:6379/0`, `unix:///path?db=0`.
    pub(crate) shown: String,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// One server, a cluster, or a master found through Sentinel.
    pub(crate) topology: Topology,
    /// Replicas that must confirm each write (`wait_replicas`).
    pub(crate) durability: Option<Durability>,
    /// Waiters served in arrival order (`fair`, default true); false lets newcomers barge.
    pub(crate) fair: bool,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("server", &self.shown)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish_non_exhaustive()
    }
}

/// Options of the Python peer's client (redis-py) that tune its connection pool and have no
/// meaning here; accepted, so one DSN serves both, and ignored. Options that would change what
/// is connected to or how it is secured (`ssl_*`, `username`, `password`) are not among them:
/// ignoring those would connect somewhere the user did not mean.
const IGNORED_OPTIONS: &[&str] = &[
    "client_name",
    "health_check_interval",
    "max_connections",
    "retry_on_timeout",
    "socket_keepalive",
    "decode_responses",
    "encoding",
    "encoding_errors",
];

/// The longest socket timeout a DSN may ask for: one day (a longer one is a hang in all but name).
const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Parses a DSN. Errors show the scheme only.
pub(crate) fn parse(text: &str) -> Result<RedisConfig> {
    let dsn = Dsn::split_lenient(text, "Redis");
    let mut options = dsn.options();
    let config = read(&dsn, "", &mut options)?;
    ignore_pool_options(&mut options);
    options.finish()?;
    Ok(config)
}

/// The Redis rules for a DSN whose schemes carry `suffix` (`+pubsub` for the pub/sub store):
/// the server and the Redis options, taken out of `options`; the caller reads its own and
/// finishes them. Clusters and Sentinel (`redis+cluster://`, `redis+sentinel://`, Symfony's
/// `redis_cluster=1` and `redis_sentinel=`) are for the lock store only (`suffix` empty).
pub(crate) fn read(
    dsn: &Dsn<'_>,
    suffix: &str,
    options: &mut Options<'_, '_>,
) -> Result<RedisConfig> {
    let base = dsn.scheme.strip_suffix(suffix).unwrap_or("");
    let (base, scheme_kind) = split_scheme(base);
    let (tls, unix) = match base {
        "redis" | "valkey" => (false, false),
        "rediss" | "valkeys" => (true, false),
        "unix" if scheme_kind == Kind::Single => (false, true),
        _ => {
            return Err(Error::invalid_argument(format!(
                "\"{}\" is not a {} scheme; expected one of redis{suffix}, rediss{suffix}, \
                 valkey{suffix}, valkeys{suffix}, unix{suffix}{}",
                crate::redact::shown_scheme(dsn.written),
                dsn.what,
                if suffix.is_empty() {
                    ", or redis+cluster, redis+sentinel (and their rediss, valkey, valkeys forms)"
                } else {
                    ""
                }
            )));
        }
    };
    let prefix = options.take("prefix").unwrap_or_default();
    let db = options.take("db");
    let response_timeout = options.seconds("socket_timeout", MAX_TIMEOUT)?;
    let connect_timeout = options.seconds("socket_connect_timeout", MAX_TIMEOUT)?;
    let symfony = SymfonyForm::take(dsn, options)?;
    let kind = symfony.kind(dsn, scheme_kind)?;
    if kind != Kind::Single && !suffix.is_empty() {
        return Err(dsn.invalid(
            "this store needs one server: a Redis Cluster or Sentinel is for the redis:// store",
        ));
    }
    if unix && kind != Kind::Single {
        return Err(dsn.invalid("a cluster or Sentinel is reached over TCP, not a unix socket"));
    }
    let (durability, fair) = if suffix.is_empty() {
        (
            durability(dsn, options, MAX_TIMEOUT)?,
            options.flag("fair")?.unwrap_or(true),
        )
    } else {
        (None, true)
    };
    let passed_on: Vec<(String, String)> = options
        .take("protocol")
        .map(|p| ("protocol".to_owned(), p))
        .into_iter()
        .collect();
    let (user, password) = credentials(dsn, &symfony)?.unwrap_or_default();
    let server = Server {
        user,
        password,
        db: database(dsn, db, symfony.dbindex.clone())?,
        passed_on,
    };
    let (client_url, shown, topology) = server.locate(dsn, kind, &symfony, suffix, tls, unix)?;
    // Let redis-rs check what it will see, so a bad DSN fails now and not at first use.
    redis::Client::open(client_url.as_str())
        .map_err(|e| dsn.invalid(format!("the client refuses it ({:?})", e.kind())))?;
    Ok(RedisConfig {
        client_url,
        shown,
        prefix,
        connect_timeout: connect_timeout
            .or(symfony.timeout)
            .unwrap_or(DEFAULT_TIMEOUT),
        response_timeout: response_timeout
            .or(symfony.read_timeout)
            .unwrap_or(DEFAULT_TIMEOUT),
        topology,
        durability,
        fair,
    })
}

/// The user name and password: the URL's, or Symfony's forms'; refused when both give some.
fn credentials(dsn: &Dsn<'_>, symfony: &SymfonyForm) -> Result<Option<(String, Option<String>)>> {
    match (dsn.credentials()?, symfony.credentials.clone()) {
        (Some(_), Some(_)) => {
            Err(dsn.invalid("the credentials are given twice (before the host and auth=)"))
        }
        (url, options) => Ok(url.or(options)),
    }
}

/// The `db` option, or Symfony's `dbindex`; a path's database (`redis://h/2`) must agree with
/// `dbindex` (a PHP peer reading the same DSN would lock in another database otherwise).
fn database(dsn: &Dsn<'_>, db: Option<String>, dbindex: Option<String>) -> Result<Option<String>> {
    let Some(index) = dbindex else {
        return Ok(db);
    };
    let path = dsn
        .url
        .map(|u| u.path)
        .filter(|p| !p.is_empty() && !p.contains('/'));
    if db
        .iter()
        .chain(path.map(str::to_owned).iter())
        .any(|d| *d != index)
    {
        return Err(dsn.invalid("dbindex disagrees with the database the DSN names"));
    }
    Ok(Some(index))
}

/// redis-py's pool options: accepted and dropped.
pub(crate) fn ignore_pool_options(options: &mut Options<'_, '_>) {
    options.ignore(IGNORED_OPTIONS);
}

/// What the client URL is made of besides the address.
struct Server {
    user: String,
    password: Option<String>,
    db: Option<String>,
    passed_on: Vec<(String, String)>,
}

impl Server {
    fn db(&self, dsn: &Dsn<'_>, default: &str) -> Result<u32> {
        self.db
            .as_deref()
            .unwrap_or(default)
            .parse::<u32>()
            .map_err(|_| dsn.invalid("the database must be a number"))
    }

    /// Where the DSN points: the client URL, the shown form and the topology.
    fn locate(
        &self,
        dsn: &Dsn<'_>,
        kind: Kind,
        symfony: &SymfonyForm,
        suffix: &str,
        tls: bool,
        unix: bool,
    ) -> Result<(String, String, Topology)> {
        Ok(match kind {
            Kind::Single if unix => {
                let (client, shown) =
                    self.unix(dsn, &dsn.url(&format!("unix{suffix}:///path"))?, suffix)?;
                (client, shown, Topology::Single)
            }
            Kind::Single if dsn.url.is_none() && symfony.hosts.len() == 1 => {
                let (client, shown) = self.tcp(dsn, &symfony.hosts[0], "", None, suffix, tls)?;
                (client, shown, Topology::Single)
            }
            Kind::Single => {
                if !symfony.hosts.is_empty() {
                    return Err(dsn.invalid(
                        "several hosts name a cluster (redis_cluster=1) or Sentinel (redis_sentinel=)",
                    ));
                }
                let url = dsn.url(&format!("redis{suffix}://host:port/db"))?;
                let (client, shown) =
                    self.tcp(dsn, url.hosts, url.path, url.fragment, suffix, tls)?;
                (client, shown, Topology::Single)
            }
            Kind::Cluster => self.cluster(dsn, symfony, tls)?,
            Kind::Sentinel => self.sentinel(dsn, symfony, tls)?,
        })
    }

    /// `unix:///path`: the client URL (credentials and db as options) and the shown form.
    fn unix(&self, dsn: &Dsn<'_>, url: &UrlParts<'_>, suffix: &str) -> Result<(String, String)> {
        if !url.hosts.is_empty() || !url.has_path {
            return Err(dsn.invalid("expected an absolute socket path"));
        }
        let db = self.db(dsn, "0")?;
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        q.append_pair("db", &db.to_string());
        if !self.user.is_empty() {
            q.append_pair("user", &self.user);
        }
        if let Some(pw) = &self.password {
            q.append_pair("pass", pw);
        }
        for (k, v) in &self.passed_on {
            q.append_pair(k, v);
        }
        let path = dsn.decode("socket path", url.path)?;
        Ok((
            format!("unix:///{}?{}", url.path, q.finish()),
            format!("unix{suffix}:///{path}?db={db}"),
        ))
    }

    /// `redis://host:port/db`: the client URL and the shown form.
    fn tcp(
        &self,
        dsn: &Dsn<'_>,
        hostport: &str,
        path: &str,
        fragment: Option<&str>,
        suffix: &str,
        tls: bool,
    ) -> Result<(String, String)> {
        if hostport.is_empty() {
            return Err(dsn.invalid("missing host"));
        }
        if hostport.contains(',') {
            return Err(dsn.invalid(
                "several hosts name a cluster (redis+cluster://h1:p1,h2:p2) or Sentinel \
                 (redis+sentinel://s1,s2/master)",
            ));
        }
        let (host, port) = host_port(dsn, hostport, 6379)?;
        let db = self.db(dsn, if path.is_empty() { "0" } else { path })?;
        let scheme = if tls { "rediss" } else { "redis" };
        let mut client_url = self.node_url(scheme, host, port, db);
        if !self.passed_on.is_empty() {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            q.extend_pairs(&self.passed_on);
            client_url.push('?');
            client_url.push_str(&q.finish());
        }
        insecure(dsn, fragment, tls, &mut client_url)?;
        Ok((client_url, format!("{scheme}{suffix}://{host}:{port}/{db}")))
    }

    /// `scheme://[user[:password]@]host:port/db`.
    fn node_url(&self, scheme: &str, host: &str, port: u16, db: u32) -> String {
        let mut auth = String::new();
        if !self.user.is_empty() || self.password.is_some() {
            auth.push_str(&encode(&self.user));
            if let Some(pw) = &self.password {
                auth.push(':');
                auth.push_str(&encode(pw));
            }
            auth.push('@');
        }
        format!("{scheme}://{auth}{host}:{port}/{db}")
    }

    /// A cluster: every seed node's URL (database 0: a cluster has no other), the first as the
    /// client URL, and `redis+cluster://h1:p1,h2:p2` shown.
    fn cluster(
        &self,
        dsn: &Dsn<'_>,
        symfony: &SymfonyForm,
        tls: bool,
    ) -> Result<(String, String, Topology)> {
        let (hosts, path, fragment) = url_parts(dsn);
        if self.db(dsn, if path.is_empty() { "0" } else { path })? != 0 {
            return Err(dsn.invalid("a Redis Cluster has database 0 only"));
        }
        let scheme = if tls { "rediss" } else { "redis" };
        let listed = host_list(dsn, hosts, &symfony.hosts, 6379)?;
        let mut nodes = Vec::new();
        for (host, port) in &listed {
            let mut url = self.node_url(scheme, host, *port, 0);
            insecure(dsn, fragment, tls, &mut url)?;
            nodes.push(url);
        }
        let shown = shown_hosts(&listed);
        Ok((
            nodes[0].clone(),
            format!("{scheme}+cluster://{shown}"),
            Topology::Cluster { nodes },
        ))
    }

    /// Sentinel: the sentinels' URLs (no credentials: those are the master's), the master's
    /// name and database; `redis+sentinel://s1:26379,s2:26379/<master>/<db>` shown.
    fn sentinel(
        &self,
        dsn: &Dsn<'_>,
        symfony: &SymfonyForm,
        tls: bool,
    ) -> Result<(String, String, Topology)> {
        let (hosts, path, fragment) = url_parts(dsn);
        let listed = host_list(dsn, hosts, &symfony.hosts, default_port(Kind::Sentinel))?;
        let (master, db) = sentinel_path(dsn, path, symfony.sentinel.clone(), self.db.clone())?;
        let scheme = if tls { "rediss" } else { "redis" };
        let mut sentinels = Vec::new();
        for (host, port) in &listed {
            let mut url = format!("{scheme}://{host}:{port}");
            insecure(dsn, fragment, tls, &mut url)?;
            sentinels.push(url);
        }
        let shown = shown_hosts(&listed);
        let shown_master: String =
            url::form_urlencoded::byte_serialize(master.as_bytes()).collect();
        Ok((
            sentinels[0].clone(),
            format!("{scheme}+sentinel://{shown}/{shown_master}/{db}"),
            Topology::Sentinel {
                sentinels,
                master,
                db,
                user: self.user.clone(),
                password: self.password.clone(),
                tls,
            },
        ))
    }
}

/// The `//` parts a cluster or Sentinel reads: hosts, path and fragment (empty for Symfony's
/// `redis:?host[…]` form, which has none).
fn url_parts<'a>(dsn: &Dsn<'a>) -> (&'a str, &'a str, Option<&'a str>) {
    dsn.url
        .map_or(("", "", None), |u| (u.hosts, u.path, u.fragment))
}

/// `h1:p1,h2:p2`, as a cluster's or Sentinel's DSN is shown.
fn shown_hosts(listed: &[(String, u16)]) -> String {
    listed
        .iter()
        .map(|(h, p)| format!("{h}:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `#insecure` after a TLS DSN (certificates not checked) goes on to the client URL.
fn insecure(dsn: &Dsn<'_>, fragment: Option<&str>, tls: bool, url: &mut String) -> Result<()> {
    match fragment {
        Some("insecure") if tls => url.push_str("#insecure"),
        Some(_) => return Err(dsn.invalid("only #insecure may follow a rediss DSN")),
        None => {}
    }
    Ok(())
}

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
