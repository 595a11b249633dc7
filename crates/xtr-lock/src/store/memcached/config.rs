//! Memcached DSNs: `memcached://host[:port][?options]` and `memcached:///path/to/socket`.

use std::time::Duration;

use crate::error::{Error, Result};

/// Memcached's port.
pub(crate) const DEFAULT_PORT: u16 = 11211;
/// The connect and response timeouts unless the DSN says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Address {
    Tcp(String, u16),
    Unix(std::path::PathBuf),
}

/// A parsed DSN; it holds no credential (the text protocol has none, and one is refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemcachedConfig {
    pub(crate) address: Address,
    /// `memcached://host:port` or `memcached:///path`, for `Display` and errors.
    pub(crate) shown: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) timeout: Duration,
}

/// Whether `dsn` names the Memcached store.
pub(crate) fn is_memcached_dsn(dsn: &str) -> bool {
    dsn.split_once(':')
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("memcached"))
}

fn invalid(scheme: &str, what: impl std::fmt::Display) -> Error {
    Error::invalid_argument(format!(
        "invalid Memcached connection string \"{scheme}:\": {what}"
    ))
}

fn seconds(scheme: &str, option: &str, value: &str) -> Result<Duration> {
    crate::limits::positive_seconds(value, crate::limits::MAX_DURATION).ok_or_else(|| {
        invalid(
            scheme,
            format!("{option} must be a positive number of seconds"),
        )
    })
}

/// Parses a DSN. Errors show the scheme only, never what follows it.
pub(crate) fn parse(dsn: &str) -> Result<MemcachedConfig> {
    let Some((scheme, rest)) = dsn.split_once(':') else {
        return Err(invalid("memcached", "expected memcached://host[:port]"));
    };
    let Some(rest) = rest.strip_prefix("//") else {
        return Err(invalid(scheme, "expected memcached://host[:port]"));
    };
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut config = MemcachedConfig {
        address: Address::Tcp(String::new(), DEFAULT_PORT),
        shown: String::new(),
        connect_timeout: DEFAULT_TIMEOUT,
        timeout: DEFAULT_TIMEOUT,
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "connect_timeout" => config.connect_timeout = seconds(scheme, name, value)?,
            "timeout" => config.timeout = seconds(scheme, name, value)?,
            _ => {
                return Err(invalid(
                    scheme,
                    format!(
                        "unknown option {:?}; the options are connect_timeout and timeout",
                        name.chars().take(40).collect::<String>()
                    ),
                ));
            }
        }
    }
    if location.starts_with('/') {
        config.address = Address::Unix(location.into());
        config.shown = format!("memcached://{location}");
        return Ok(config);
    }
    if location.contains('@') {
        return Err(invalid(
            scheme,
            "credentials are not supported: Memcached's SASL authentication needs the binary \
             protocol, and this store speaks the text (meta) protocol",
        ));
    }
    if location.contains(',') {
        return Err(invalid(
            scheme,
            "one server per store: several servers would need the peers' key distribution to \
             share locks",
        ));
    }
    let (host, port) = if let Some(inner) = location.strip_prefix('[') {
        // [v6]:port
        let (host, after) = inner
            .split_once(']')
            .ok_or_else(|| invalid(scheme, "an IPv6 host needs its closing bracket"))?;
        (host, after.strip_prefix(':'))
    } else {
        match location.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (location, None),
        }
    };
    if host.is_empty() {
        return Err(invalid(scheme, "no host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid(scheme, "the port must be a number from 1 to 65535"))?,
    };
    config.shown = if host.contains(':') {
        format!("memcached://[{host}]:{port}")
    } else {
        format!("memcached://{host}:{port}")
    };
    config.address = Address::Tcp(host.to_owned(), port);
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_ports_sockets_and_options() {
        let c = parse("memcached://cache").unwrap();
        assert_eq!(c.address, Address::Tcp("cache".into(), 11211));
        assert_eq!(c.shown, "memcached://cache:11211");
        let c = parse("MEMCACHED://127.0.0.1:12000?timeout=2&connect_timeout=0.5").unwrap();
        assert_eq!(c.address, Address::Tcp("127.0.0.1".into(), 12000));
        assert_eq!(c.timeout, Duration::from_secs(2));
        assert_eq!(c.connect_timeout, Duration::from_millis(500));
        let c = parse("memcached://[::1]:11311").unwrap();
        assert_eq!(c.address, Address::Tcp("::1".into(), 11311));
        let c = parse("memcached:///run/memcached/memcached.sock").unwrap();
        assert_eq!(
            c.address,
            Address::Unix("/run/memcached/memcached.sock".into())
        );
    }

    #[test]
    fn refusals_say_why_and_show_no_secret() {
        for (dsn, why) in [
            ("memcached://user:hunter2@cache:11211", "credentials"),
            ("memcached://a:1,b:2", "one server"),
            ("memcached://cache:0", "port"),
            ("memcached://cache:99999", "port"),
            ("memcached://:11211", "no host"),
            ("memcached://cache?ttl=3", "unknown option"),
            ("memcached://cache?timeout=-1", "positive"),
            ("memcached:cache", "expected"),
        ] {
            let err = parse(dsn).unwrap_err().to_string();
            assert!(err.contains(why), "{dsn}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
            assert!(err.contains("memcached:\""), "{err}");
        }
    }
}
