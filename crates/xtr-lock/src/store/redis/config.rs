//! Redis DSNs: `redis://`, `rediss://` (TLS), `valkey://`, `valkeys://`, `unix://`, with the
//! options the Python peer reads (`prefix`, `socket_timeout`, `socket_connect_timeout`, `db`).

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// The schemes a Redis DSN may use (case-insensitive).
pub(crate) const SCHEMES: &[&str] = &["redis", "rediss", "valkey", "valkeys", "unix"];

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

/// Whether `dsn` names a Redis server (by its scheme).
pub(crate) fn is_redis_dsn(dsn: &str) -> bool {
    dsn.split_once(':')
        .is_some_and(|(scheme, _)| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

/// The options read here.
const OPTIONS: &[&str] = &[
    "prefix",
    "db",
    "socket_timeout",
    "socket_connect_timeout",
    "protocol",
];

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

/// A misspelled or unsupported option, named (an option name is not a secret), with the one it
/// most likely meant.
fn unknown_option(at: &At<'_>, name: &str) -> Error {
    let squash = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let shown: String = name.chars().take(40).collect();
    let meant = OPTIONS
        .iter()
        .chain(at.flavor.options)
        .chain(IGNORED_OPTIONS)
        .find(|known| squash(known) == squash(name));
    let known: Vec<&str> = OPTIONS.iter().chain(at.flavor.options).copied().collect();
    match meant {
        Some(known) => invalid(
            at,
            format!("unknown option {shown:?}; did you mean {known:?}?"),
        ),
        None => invalid(
            at,
            format!(
                "unknown option {shown:?}; the options are {}",
                known.join(", ")
            ),
        ),
    }
}

/// The DSNs a parse reads: the Redis store's, or those of a store built on the same server
/// rules with options of its own (the pub/sub store: `redis+pubsub://`).
pub(crate) struct Flavor {
    /// What the errors call it: `invalid <what> connection string`.
    pub(crate) what: &'static str,
    /// Follows every Redis scheme (`+pubsub`), and is kept in the credential-free form.
    pub(crate) suffix: &'static str,
    /// Options the store reads itself: handed back, never refused.
    pub(crate) options: &'static [&'static str],
}

const REDIS: Flavor = Flavor {
    what: "Redis",
    suffix: "",
    options: &[],
};

/// Where an error is: the scheme as written, and the flavor.
struct At<'a> {
    scheme: &'a str,
    flavor: &'a Flavor,
}

fn invalid(at: &At<'_>, what: impl fmt::Display) -> Error {
    Error::invalid_argument(format!(
        "invalid {} connection string \"{}:\": {what}",
        at.flavor.what, at.scheme
    ))
}

/// Parses a DSN. Errors show the scheme only.
pub(crate) fn parse(dsn: &str) -> Result<RedisConfig> {
    parse_with(dsn, &REDIS).map(|(config, _)| config)
}

/// Parses a DSN of `flavor`: the configuration, and the flavor's own options as given (name,
/// value), in order. Errors show the scheme only.
pub(crate) fn parse_with(
    dsn: &str,
    flavor: &Flavor,
) -> Result<(RedisConfig, Vec<(String, String)>)> {
    let suffix = flavor.suffix;
    let Some((raw_scheme, rest)) = dsn.split_once(':') else {
        return Err(Error::invalid_argument(format!(
            "a {} connection string needs a scheme (redis{suffix}://, rediss{suffix}://, unix{suffix}://)",
            flavor.what
        )));
    };
    let at = At {
        scheme: raw_scheme,
        flavor,
    };
    let lower = raw_scheme.to_ascii_lowercase();
    let (tls, unix) = match lower.strip_suffix(suffix) {
        Some("redis" | "valkey") => (false, false),
        Some("rediss" | "valkeys") => (true, false),
        Some("unix") => (false, true),
        _ => {
            return Err(Error::invalid_argument(format!(
                "\"{}\" is not a {} scheme; expected one of redis{suffix}, rediss{suffix}, \
                 valkey{suffix}, valkeys{suffix}, unix{suffix}",
                crate::redact::redact(raw_scheme).trim_matches('"'),
                flavor.what
            )));
        }
    };
    let Some(rest) = rest.strip_prefix("//") else {
        return Err(invalid(&at, "expected \"//\" after the scheme"));
    };
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (before_query, fragment) = match before_query.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (before_query, None),
    };
    let query = query.split_once('#').map_or(query, |(q, _)| q);

    // Options: form-decoded, blank values kept, the last one wins.
    let mut prefix = String::new();
    let mut connect_timeout = DEFAULT_TIMEOUT;
    let mut response_timeout = DEFAULT_TIMEOUT;
    let mut db_option: Option<String> = None;
    let mut passed_on: Vec<(String, String)> = Vec::new();
    let mut own: Vec<(String, String)> = Vec::new();
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match name.as_ref() {
            "prefix" => prefix = value.into_owned(),
            "socket_timeout" => response_timeout = seconds(&at, "socket_timeout", &value)?,
            "socket_connect_timeout" => {
                connect_timeout = seconds(&at, "socket_connect_timeout", &value)?;
            }
            "db" => db_option = Some(value.into_owned()),
            "protocol" => passed_on.push(("protocol".into(), value.into_owned())),
            other if flavor.options.contains(&other) => {
                own.push((other.to_owned(), value.into_owned()));
            }
            other if IGNORED_OPTIONS.contains(&other) => {}
            other => return Err(unknown_option(&at, other)),
        }
    }

    let (userinfo, location) = match before_query.rsplit_once('@') {
        Some((u, l)) => (Some(u), l),
        None => (None, before_query),
    };
    let (user, password) = match userinfo {
        Some(u) => match u.split_once(':') {
            Some((user, pw)) => (decode(&at, user)?, Some(decode(&at, pw)?)),
            None => (decode(&at, u)?, None),
        },
        None => (String::new(), None),
    };

    let (client_url, shown) = if unix {
        if !location.starts_with('/') {
            return Err(invalid(&at, "expected an absolute socket path"));
        }
        let db = parse_db(&at, db_option.as_deref().unwrap_or("0"))?;
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        q.append_pair("db", &db.to_string());
        if !user.is_empty() {
            q.append_pair("user", &user);
        }
        if let Some(pw) = &password {
            q.append_pair("pass", pw);
        }
        for (k, v) in &passed_on {
            q.append_pair(k, v);
        }
        let path = decode(&at, location)?;
        (
            format!("unix://{location}?{}", q.finish()),
            format!("unix{suffix}://{path}?db={db}"),
        )
    } else {
        let (hostport, path) = match location.split_once('/') {
            Some((h, p)) => (h, p),
            None => (location, ""),
        };
        if hostport.is_empty() {
            return Err(invalid(&at, "missing host"));
        }
        let (host, port) = split_port(&at, hostport)?;
        let db = parse_db(
            &at,
            db_option.as_deref().unwrap_or(match path {
                "" => "0",
                p => p,
            }),
        )?;
        let mut auth = String::new();
        if !user.is_empty() || password.is_some() {
            auth.push_str(&encode(&user));
            if let Some(pw) = &password {
                auth.push(':');
                auth.push_str(&encode(pw));
            }
            auth.push('@');
        }
        let scheme_out = if tls { "rediss" } else { "redis" };
        let mut client_url = format!("{scheme_out}://{auth}{host}:{port}/{db}");
        if !passed_on.is_empty() {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in &passed_on {
                q.append_pair(k, v);
            }
            client_url.push('?');
            client_url.push_str(&q.finish());
        }
        match fragment {
            Some("insecure") if tls => client_url.push_str("#insecure"),
            Some(_) => {
                return Err(invalid(&at, "only #insecure may follow a rediss DSN"));
            }
            None => {}
        }
        (
            client_url,
            format!("{scheme_out}{suffix}://{host}:{port}/{db}"),
        )
    };
    // Let redis-rs check what it will see, so a bad DSN fails now and not at first use.
    redis::Client::open(client_url.as_str())
        .map_err(|e| invalid(&at, format!("the client refuses it ({})", e.kind_str())))?;
    Ok((
        RedisConfig {
            client_url,
            shown,
            prefix,
            connect_timeout,
            response_timeout,
        },
        own,
    ))
}

trait KindStr {
    fn kind_str(&self) -> String;
}

impl KindStr for redis::RedisError {
    fn kind_str(&self) -> String {
        // The kind only: a client error's text could echo what it was given.
        format!("{:?}", self.kind())
    }
}

/// The longest socket timeout a DSN may ask for: one day (a longer one is a hang in all but name).
const MAX_TIMEOUT_SECS: f64 = 86_400.0;

fn seconds(at: &At<'_>, option: &str, value: &str) -> Result<Duration> {
    match value.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= MAX_TIMEOUT_SECS => {
            Ok(Duration::from_secs_f64(s))
        }
        _ => Err(invalid(
            at,
            format!("{option} must be a positive number of seconds, at most {MAX_TIMEOUT_SECS}"),
        )),
    }
}

fn parse_db(at: &At<'_>, db: &str) -> Result<u32> {
    db.parse::<u32>()
        .map_err(|_| invalid(at, "the database must be a number"))
}

fn split_port<'a>(at: &At<'_>, hostport: &'a str) -> Result<(&'a str, u16)> {
    // [v6]:port, [v6], host:port, host
    if let Some(rest) = hostport.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return Err(invalid(at, "unclosed IPv6 address"));
        };
        let port = match after.strip_prefix(':') {
            Some(p) => p
                .parse()
                .map_err(|_| invalid(at, "the port must be a number"))?,
            None => 6379,
        };
        return Ok((&hostport[..v6.len() + 2], port));
    }
    match hostport.rsplit_once(':') {
        Some((host, port)) => Ok((
            host,
            port.parse()
                .map_err(|_| invalid(at, "the port must be a number"))?,
        )),
        None => Ok((hostport, 6379)),
    }
}

fn decode(at: &At<'_>, s: &str) -> Result<String> {
    percent_decode(s).ok_or_else(|| invalid(at, "credentials are not valid percent-encoded UTF-8"))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsns_parse_into_what_the_client_sees() {
        let cases = [
            (
                "redis://localhost",
                "redis://localhost:6379/0",
                "redis://localhost:6379/0",
                "",
            ),
            (
                "REDIS://h:7000/3",
                "redis://h:7000/3",
                "redis://h:7000/3",
                "",
            ),
            ("valkey://h/2", "redis://h:6379/2", "redis://h:6379/2", ""),
            ("valkeys://h", "rediss://h:6379/0", "rediss://h:6379/0", ""),
            ("VALKEY://h", "redis://h:6379/0", "redis://h:6379/0", ""),
            (
                "redis://app:s%40cret@h:6380/1?db=4",
                "redis://app:s%40cret@h:6380/4",
                "redis://h:6380/4",
                "",
            ),
            (
                "rediss://:pw@h?prefix=app%3Alocks%3A&socket_timeout=30",
                "rediss://:pw@h:6379/0",
                "rediss://h:6379/0",
                "app:locks:",
            ),
            (
                "redis://h?prefix=a&prefix=b",
                "redis://h:6379/0",
                "redis://h:6379/0",
                "b",
            ),
            (
                "redis://h?prefix=",
                "redis://h:6379/0",
                "redis://h:6379/0",
                "",
            ),
            (
                "redis://h?prefix=a+b",
                "redis://h:6379/0",
                "redis://h:6379/0",
                "a b",
            ),
            (
                "redis://[::1]:7000",
                "redis://[::1]:7000/0",
                "redis://[::1]:7000/0",
                "",
            ),
            (
                "unix:///run/redis.sock?db=2",
                "unix:///run/redis.sock?db=2",
                "unix:///run/redis.sock?db=2",
                "",
            ),
            (
                "unix://u:p@/run/redis.sock",
                "unix:///run/redis.sock?db=0&user=u&pass=p",
                "unix:///run/redis.sock?db=0",
                "",
            ),
        ];
        for (dsn, client, shown, prefix) in cases {
            let c = parse(dsn).unwrap_or_else(|e| panic!("{dsn}: {e}"));
            assert_eq!(c.client_url, client, "{dsn}");
            assert_eq!(c.shown, shown, "{dsn}");
            assert_eq!(c.prefix, prefix, "{dsn}");
        }
    }

    #[test]
    fn timeouts_default_to_5_s_and_can_be_overridden() {
        let c = parse("redis://h").unwrap();
        assert_eq!(
            (c.connect_timeout, c.response_timeout),
            (DEFAULT_TIMEOUT, DEFAULT_TIMEOUT)
        );
        let c = parse("redis://h?socket_connect_timeout=2&socket_timeout=30").unwrap();
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.response_timeout, Duration::from_secs(30));
    }

    #[test]
    fn bad_dsns_are_refused_without_echoing_secrets() {
        for dsn in [
            "mysql://u:hunter2@h/db",
            "redis:h",
            "redis://u:hunter2@",
            "redis://u:hunter2@h:notaport",
            "redis://u:hunter2@h/notadb",
            "redis://u:hunter2@h?socket_timeout=-1",
            "redis://u:hunter2@h?socket_timeout=abc",
            "redis://u:hunter2@h#fragment",
            "unix://u:hunter2@relative",
        ] {
            let err = parse(dsn).unwrap_err();
            let msg = err.to_string();
            assert!(err.is_invalid_argument(), "{dsn}: {msg}");
            assert!(!msg.contains("hunter2"), "{dsn}: {msg}");
            assert!(!format!("{err:?}").contains("hunter2"), "{dsn}");
        }
        assert!(parse("mysql://x").unwrap_err().to_string().starts_with(
            "\"mysql\" is not a Redis scheme; expected one of redis, rediss, valkey, valkeys, unix"
        ));
        let c = parse("redis://u:hunter2@h").unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn unknown_options_are_refused_by_name() {
        let err = parse("redis://u:hunter2@h?sockettimeout=3").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid Redis connection string \"redis:\": unknown option \"sockettimeout\"; \
             did you mean \"socket_timeout\"?"
        );
        let err = parse("redis://h?ssl_ca_certs=/ca.pem").unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown option \"ssl_ca_certs\"; the options are prefix, db,"),
            "{err}"
        );
        parse("redis://h?health_check_interval=10&client_name=x").expect("redis-py's pool options");
    }

    #[test]
    fn redis_schemes_are_recognised_case_insensitively() {
        for dsn in [
            "redis://h",
            "REDISS://h",
            "valkey://h",
            "Valkeys://h",
            "unix:///s",
        ] {
            assert!(is_redis_dsn(dsn), "{dsn}");
        }
        for dsn in ["flock", "in-memory", "mysql://h", "redis"] {
            assert!(!is_redis_dsn(dsn), "{dsn}");
        }
    }
}
