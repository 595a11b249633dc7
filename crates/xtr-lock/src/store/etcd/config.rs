//! etcd DSNs: `etcd://[user[:password]@]host[:port][,host[:port]…][/prefix][?options]`, and
//! `etcds://` for TLS.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// etcd's client port.
const DEFAULT_PORT: u16 = 2379;
/// The lease ttl when neither the lock nor the DSN gives one: the Go client's session default.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(60);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest timeout or ttl a DSN may ask for: one day.
const MAX_SECS: f64 = 86_400.0;
const OPTIONS: &[&str] = &[
    "ttl",
    "keepalive",
    "connect_timeout",
    "request_timeout",
    "ca_file",
    "cert_file",
    "key_file",
];

/// A parsed DSN. `Display` and `Debug` never show the password.
#[derive(Clone)]
pub(crate) struct EtcdConfig {
    /// `http://host:port` or `https://host:port`, one per member.
    pub(crate) endpoints: Vec<String>,
    pub(crate) user: Option<(String, String)>,
    /// Put before every resource: `<prefix><resource>/<lease id in hex>`.
    pub(crate) prefix: String,
    /// The lease ttl of a lock that does not give its own.
    pub(crate) ttl: Duration,
    /// Between keep-alives; `None`: a third of the lease's ttl.
    pub(crate) keepalive: Option<Duration>,
    pub(crate) connect_timeout: Duration,
    /// How long one request may take before it fails as unanswered.
    pub(crate) request_timeout: Duration,
    pub(crate) tls: Option<TlsFiles>,
    /// The store's name: scheme, members and prefix, without credentials.
    pub(crate) shown: String,
}

/// Certificates for `etcds://`, read when the store connects.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("store", &self.shown)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("ttl", &self.ttl)
            .field("keepalive", &self.keepalive)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// Whether `dsn` names the etcd store.
pub(crate) fn is_etcd_dsn(dsn: &str) -> bool {
    dsn.split_once("://")
        .is_some_and(|(s, _)| s.eq_ignore_ascii_case("etcd") || s.eq_ignore_ascii_case("etcds"))
}

fn invalid(scheme: &str, what: impl fmt::Display) -> Error {
    Error::invalid_argument(format!(
        "invalid etcd connection string \"{scheme}://\": {what}"
    ))
}

fn seconds(scheme: &str, option: &str, value: &str) -> Result<Duration> {
    crate::limits::positive_seconds(value, Duration::from_secs_f64(MAX_SECS)).ok_or_else(|| {
        invalid(
            scheme,
            format!("{option} must be a positive number of seconds, at most {MAX_SECS}"),
        )
    })
}

/// A lock's `ttl` as a lease's: etcd grants leases in whole seconds, at least one. A ttl it
/// cannot keep is refused rather than rounded: the ttl says how long a dead holder's lock
/// outlives it, and a user who asked for 0.5 s did not mean 1 s (or the 2 s the server's
/// minimum may make of it).
pub(crate) fn lease_ttl(ttl: Duration) -> Result<Duration> {
    if ttl >= Duration::from_secs(1) && ttl.subsec_nanos() == 0 {
        return Ok(ttl);
    }
    let up = ttl.as_secs() + 1;
    Err(Error::invalid_argument(format!(
        "an etcd lease is whole seconds, at least 1 s: a ttl of {} cannot be kept (give {up}s)",
        humantime::format_duration(ttl)
    )))
}

/// `%XX` escapes decoded (user, password, prefix), refusing broken ones and non-UTF-8.
fn decode(scheme: &str, what: &str, s: &str) -> Result<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(b) = hex else {
                return Err(invalid(scheme, format!("a broken %-escape in the {what}")));
            };
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid(scheme, format!("the {what} is not UTF-8")))
}

/// One `host[:port]` (or `[v6][:port]`), as `host:port`.
fn member(scheme: &str, hostport: &str) -> Result<String> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return Err(invalid(scheme, "an unclosed IPv6 address"));
        };
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| invalid(scheme, "junk after an IPv6 address"))?,
            ),
        };
        (format!("[{v6}]"), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (hostport.to_owned(), None),
        }
    };
    if host.is_empty() || host.contains(['/', '?', '#', '@', ' ']) {
        return Err(invalid(scheme, "every member needs a host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid(scheme, "a port must be a number from 1 to 65535"))?,
    };
    Ok(format!("{host}:{port}"))
}

/// Parses a DSN. Errors show the scheme and what is wrong, never the password.
pub(crate) fn parse(dsn: &str) -> Result<EtcdConfig> {
    let Some((scheme, rest)) = dsn.split_once("://") else {
        return Err(Error::invalid_argument(
            "invalid etcd connection string: write etcd://host:port[,host:port…][/prefix]",
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    let tls = match scheme.as_str() {
        "etcd" => false,
        "etcds" => true,
        _ => return Err(invalid(&scheme, "the scheme must be etcd or etcds")),
    };
    if rest.contains('#') {
        return Err(invalid(&scheme, "a DSN has no #fragment"));
    }
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let user = match userinfo {
        None => None,
        Some(u) => {
            let (name, password) = u.split_once(':').unwrap_or((u, ""));
            let name = decode(&scheme, "user name", name)?;
            if name.is_empty() {
                return Err(invalid(
                    &scheme,
                    "a password needs a user name (user:password@)",
                ));
            }
            Some((name, decode(&scheme, "password", password)?))
        }
    };
    if hosts.is_empty() {
        return Err(invalid(&scheme, "no member: write host:port[,host:port…]"));
    }
    let members = hosts
        .split(',')
        .map(|m| member(&scheme, m.trim()))
        .collect::<Result<Vec<_>>>()?;
    let prefix = decode(&scheme, "prefix", path)?;
    let mut config = EtcdConfig {
        endpoints: members
            .iter()
            .map(|m| format!("{}://{m}", if tls { "https" } else { "http" }))
            .collect(),
        user,
        prefix: prefix.clone(),
        ttl: DEFAULT_TTL,
        keepalive: None,
        connect_timeout: DEFAULT_TIMEOUT,
        request_timeout: DEFAULT_TIMEOUT,
        tls: tls.then(TlsFiles::default),
        shown: format!(
            "{scheme}://{}{}",
            members.join(","),
            if path.is_empty() {
                String::new()
            } else {
                format!("/{path}")
            }
        ),
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(&scheme, name, value)?;
        match name {
            "ttl" => {
                let ttl = seconds(&scheme, name, &value)?;
                if lease_ttl(ttl).is_err() {
                    return Err(invalid(&scheme, "ttl is whole seconds, at least 1"));
                }
                config.ttl = ttl;
            }
            "keepalive" => config.keepalive = Some(seconds(&scheme, name, &value)?),
            "connect_timeout" => config.connect_timeout = seconds(&scheme, name, &value)?,
            "request_timeout" => config.request_timeout = seconds(&scheme, name, &value)?,
            "ca_file" | "cert_file" | "key_file" => {
                let Some(files) = config.tls.as_mut() else {
                    return Err(invalid(&scheme, format!("{name} needs etcds://")));
                };
                let path = Some(PathBuf::from(value));
                match name {
                    "ca_file" => files.ca = path,
                    "cert_file" => files.cert = path,
                    _ => files.key = path,
                }
            }
            other => {
                return Err(invalid(
                    &scheme,
                    format!("unknown option \"{other}\" (known: {})", OPTIONS.join(", ")),
                ));
            }
        }
    }
    if let Some(files) = &config.tls
        && files.cert.is_some() != files.key.is_some()
    {
        return Err(invalid(&scheme, "cert_file and key_file go together"));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_prefix_and_options() {
        let c = parse("etcd://app:s%40cret@10.0.0.1:2379,10.0.0.2,[::1]:2380/locks/?ttl=10&keepalive=2&request_timeout=0.5").unwrap();
        assert_eq!(
            c.endpoints,
            [
                "http://10.0.0.1:2379",
                "http://10.0.0.2:2379",
                "http://[::1]:2380"
            ]
        );
        assert_eq!(c.user, Some(("app".into(), "s@cret".into())));
        assert_eq!(c.prefix, "locks/");
        assert_eq!(c.ttl, Duration::from_secs(10));
        assert_eq!(c.keepalive, Some(Duration::from_secs(2)));
        assert_eq!(c.request_timeout, Duration::from_millis(500));
        assert_eq!(
            c.shown,
            "etcd://10.0.0.1:2379,10.0.0.2:2379,[::1]:2380/locks/"
        );
        assert!(!format!("{c:?}").contains("cret"));
        let c = parse("ETCD://h").unwrap();
        assert_eq!(c.prefix, "");
        assert_eq!(c.ttl, DEFAULT_TTL);
        assert_eq!(c.endpoints, ["http://h:2379"]);
        let c = parse("etcds://h:1/?ca_file=/ca.pem").unwrap();
        assert_eq!(c.endpoints, ["https://h:1"]);
        assert_eq!(c.tls.unwrap().ca, Some(PathBuf::from("/ca.pem")));
        assert!(is_etcd_dsn("etcd://h") && is_etcd_dsn("Etcds://h"));
        assert!(!is_etcd_dsn("redis://h") && !is_etcd_dsn("etcd"));
    }

    #[test]
    fn bad_dsns_say_what_is_wrong_without_the_password() {
        for (dsn, says) in [
            ("etcd://", "no member"),
            ("etcd://u:pw@h:0", "port"),
            ("etcd://u:pw@h:x", "port"),
            ("etcd://u:pw@h,,h2", "host"),
            ("etcd://:pw@h", "user name"),
            ("etcd://u:pw@h?ttl=0", "ttl"),
            ("etcd://u:pw@h?ttl=0.5", "at least 1"),
            ("etcd://u:pw@h?ttl=1.5", "whole seconds"),
            ("etcd://u:pw@h?tll=5", "unknown option \"tll\""),
            ("etcd://u:pw@h?ca_file=x", "needs etcds"),
            ("etcds://u:pw@h?cert_file=x", "go together"),
            ("etcd://u:pw@h/%zz", "%-escape"),
            ("etcd://u:pw@h#f", "fragment"),
            ("etcd://u:pw@[::1", "IPv6"),
        ] {
            let err = parse(dsn).unwrap_err().to_string();
            assert!(err.contains(says), "{dsn}: {err}");
            assert!(!err.contains("pw"), "{dsn}: {err}");
        }
    }
}
