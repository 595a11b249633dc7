//! Memcached DSNs: `memcached://host[:port][?options]` and `memcached:///path/to/socket`.

use std::time::Duration;

use crate::dsn::{Dsn, host_port};
use crate::error::Result;
use crate::limits::MAX_DURATION;

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

/// Parses a DSN. Errors show the scheme only, never what follows it.
pub(crate) fn parse(text: &str) -> Result<MemcachedConfig> {
    let dsn = Dsn::split(text, "Memcached");
    if dsn.scheme != "memcached" {
        return Err(dsn.invalid("expected memcached://host[:port]"));
    }
    let url = dsn.url("memcached://host[:port]")?;
    let mut options = dsn.options_percent()?;
    let mut config = MemcachedConfig {
        address: Address::Tcp(String::new(), DEFAULT_PORT),
        shown: String::new(),
        connect_timeout: options.seconds_or("connect_timeout", MAX_DURATION, DEFAULT_TIMEOUT)?,
        timeout: options.seconds_or("timeout", MAX_DURATION, DEFAULT_TIMEOUT)?,
    };
    options.finish()?;
    if url.fragment.is_some() {
        return Err(dsn.invalid("a Memcached DSN has no #fragment"));
    }
    if url.hosts.is_empty() && url.has_path && url.userinfo.is_none() {
        let path = format!("/{}", url.path);
        config.shown = format!("memcached://{path}");
        config.address = Address::Unix(path.into());
        return Ok(config);
    }
    if url.userinfo.is_some() {
        return Err(dsn.invalid(
            "credentials are not supported: Memcached's SASL authentication needs the binary \
             protocol, and this store speaks the text (meta) protocol",
        ));
    }
    if url.hosts.contains(',') {
        return Err(dsn.invalid(
            "one server per store: several servers would need the peers' key distribution to \
             share locks",
        ));
    }
    if url.hosts.is_empty() {
        return Err(dsn.invalid("no host"));
    }
    if url.has_path {
        return Err(dsn.invalid("a Memcached DSN names a server, not a path after it"));
    }
    let (host, port) = host_port(&dsn, url.hosts, DEFAULT_PORT)?;
    config.shown = format!("memcached://{host}:{port}");
    config.address = Address::Tcp(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port,
    );
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

    #[test]
    fn a_path_or_a_fragment_after_the_server_is_refused() {
        for dsn in [
            "memcached://cache:11211/0",
            "memcached://cache#x",
            "memcached:///s#x",
        ] {
            assert!(parse(dsn).is_err(), "{dsn}");
        }
    }
}
