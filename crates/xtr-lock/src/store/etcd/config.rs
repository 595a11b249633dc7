//! etcd DSNs: `etcd://[user[:password]@]host[:port][,host[:port]…][/prefix][?options]`, and
//! `etcds://` for TLS.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::dsn::{Dsn, Options, host_port};
use crate::error::{Error, Result};

/// etcd's client port.
const DEFAULT_PORT: u16 = 2379;
/// The lease ttl when neither the lock nor the DSN gives one: the Go client's session default.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(60);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest timeout or ttl a DSN may ask for: one day.
const MAX_SECS: Duration = Duration::from_secs(86_400);

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

/// Parses a DSN. Errors show the scheme and what is wrong, never the password.
pub(crate) fn parse(text: &str) -> Result<EtcdConfig> {
    let dsn = Dsn::split(text, "etcd");
    let tls = match dsn.scheme.as_str() {
        "etcd" => false,
        "etcds" => true,
        _ => return Err(dsn.invalid("the scheme must be etcd or etcds")),
    };
    let url = dsn.url("etcd://host:port[,host:port…][/prefix]")?;
    if dsn.rest.contains('#') {
        return Err(dsn.invalid("a DSN has no #fragment"));
    }
    let user = match dsn.credentials()? {
        None => None,
        Some((name, _)) if name.is_empty() => {
            return Err(dsn.invalid("a password needs a user name (user:password@)"));
        }
        Some((name, password)) => Some((name, password.unwrap_or_default())),
    };
    if url.hosts.is_empty() {
        return Err(dsn.invalid("no member: write host:port[,host:port…]"));
    }
    let members = url
        .hosts
        .split(',')
        .map(|m| host_port(&dsn, m.trim(), DEFAULT_PORT).map(|(h, p)| format!("{h}:{p}")))
        .collect::<Result<Vec<_>>>()?;
    let prefix = dsn.decode("prefix", url.path)?;
    // Percent-decoding only: a `+` in a certificate's path is a `+`.
    let mut options = dsn.options_percent()?;
    let config = EtcdConfig {
        endpoints: members
            .iter()
            .map(|m| format!("{}://{m}", if tls { "https" } else { "http" }))
            .collect(),
        user,
        prefix,
        ttl: lease_option(&dsn, &mut options)?,
        keepalive: options.seconds("keepalive", MAX_SECS)?,
        connect_timeout: options.seconds_or("connect_timeout", MAX_SECS, DEFAULT_TIMEOUT)?,
        request_timeout: options.seconds_or("request_timeout", MAX_SECS, DEFAULT_TIMEOUT)?,
        tls: tls_files(&dsn, tls, &mut options)?,
        shown: format!(
            "{}://{}{}",
            dsn.scheme,
            members.join(","),
            if url.path.is_empty() {
                String::new()
            } else {
                format!("/{}", url.path)
            }
        ),
    };
    options.finish()?;
    Ok(config)
}

/// `ttl=`: whole seconds, at least one (the default: [`DEFAULT_TTL`]).
fn lease_option(dsn: &Dsn<'_>, options: &mut Options<'_, '_>) -> Result<Duration> {
    match options.seconds("ttl", MAX_SECS)? {
        None => Ok(DEFAULT_TTL),
        Some(ttl) if lease_ttl(ttl).is_ok() => Ok(ttl),
        Some(_) => Err(dsn.invalid("ttl is whole seconds, at least 1")),
    }
}

/// `ca_file=`, `cert_file=`, `key_file=`: only with `etcds://`, a certificate with its key.
fn tls_files(dsn: &Dsn<'_>, tls: bool, options: &mut Options<'_, '_>) -> Result<Option<TlsFiles>> {
    let files = TlsFiles {
        ca: options.take("ca_file").map(PathBuf::from),
        cert: options.take("cert_file").map(PathBuf::from),
        key: options.take("key_file").map(PathBuf::from),
    };
    let given = [&files.ca, &files.cert, &files.key]
        .iter()
        .position(|f| f.is_some());
    if !tls {
        return match given {
            Some(i) => Err(dsn.invalid(format!(
                "{} needs etcds://",
                ["ca_file", "cert_file", "key_file"][i]
            ))),
            None => Ok(None),
        };
    }
    if files.cert.is_some() != files.key.is_some() {
        return Err(dsn.invalid("cert_file and key_file go together"));
    }
    Ok(Some(files))
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
            ("etcd://u:pw@h/%zz", "percent-encoded"),
            ("etcd://u:pw@h#f", "fragment"),
            ("etcd://u:pw@[::1", "IPv6"),
        ] {
            let err = parse(dsn).unwrap_err().to_string();
            assert!(err.contains(says), "{dsn}: {err}");
            assert!(!err.contains("pw"), "{dsn}: {err}");
        }
    }

    #[test]
    fn option_values_are_percent_decoded_and_keep_their_plus() {
        let c = parse("etcds://h?ca_file=/etc/ssl/a+b%20c.pem").unwrap();
        assert_eq!(c.tls.unwrap().ca, Some(PathBuf::from("/etc/ssl/a+b c.pem")));
        assert!(parse("etcds://h?ca_file=/a%zz").is_err());
        assert!(
            parse("etcd://h?ttl=5#x").is_err(),
            "a fragment after the options too"
        );
    }
}
