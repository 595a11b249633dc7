//! Advisory DSNs: `postgresql+advisory://` and `postgres+advisory://`, with this library's
//! options split off before the rest goes to sqlx.

use std::str::FromStr as _;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::keys::KeyMode;
use crate::error::{Error, Result};
use crate::store::sql::config::seconds;

/// How long to wait for a connection, and for a statement that does not wait for a lock.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a holding session is pinged.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(1);
/// Idle lock connections kept for the next holder.
const DEFAULT_MAX_IDLE: usize = 16;

const OURS: &[&str] = &[
    "keys",
    "keepalive",
    "connect_timeout",
    "statement_timeout",
    "max_idle",
];

/// A parsed advisory DSN.
#[derive(Debug, Clone)]
pub(crate) struct AdvisoryConfig {
    pub(crate) options: PgConnectOptions,
    pub(crate) keys: KeyMode,
    pub(crate) keepalive: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) statement_timeout: Duration,
    pub(crate) max_idle: usize,
    /// Host, port, database and key mode, without credentials: what `Display` shows.
    pub(crate) shown: String,
}

/// Whether `dsn` names the advisory store.
pub(crate) fn is_advisory_dsn(dsn: &str) -> bool {
    let scheme = dsn
        .split_once(':')
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    matches!(scheme.as_str(), "postgres+advisory" | "postgresql+advisory")
}

/// Parses an advisory DSN. Errors show the scheme, never a credential.
pub(crate) fn parse(dsn: &str) -> Result<AdvisoryConfig> {
    let (scheme, rest) = dsn.split_once(':').unwrap_or((dsn, ""));
    let scheme = scheme.to_ascii_lowercase();
    let invalid = |why: String| {
        Error::invalid_argument(format!("invalid {scheme}: connection string: {why}"))
    };
    if !is_advisory_dsn(dsn) {
        return Err(invalid(
            "write postgresql+advisory://user:password@host:port/database".into(),
        ));
    }
    let mut url =
        url::Url::parse(&format!("postgresql:{rest}")).map_err(|e| invalid(e.to_string()))?;
    let (ours, theirs): (Vec<_>, Vec<_>) = url
        .query_pairs()
        .into_owned()
        .partition(|(k, _)| OURS.contains(&k.as_str()));
    if theirs.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(&theirs);
    }
    let mut config = AdvisoryConfig {
        options: PgConnectOptions::new(),
        keys: KeyMode::Sha256,
        keepalive: DEFAULT_KEEPALIVE,
        connect_timeout: DEFAULT_TIMEOUT,
        statement_timeout: DEFAULT_TIMEOUT,
        max_idle: DEFAULT_MAX_IDLE,
        shown: String::new(),
    };
    for (k, v) in &ours {
        match k.as_str() {
            "keys" => {
                config.keys = match v.as_str() {
                    "sha256" => KeyMode::Sha256,
                    "crc32" => KeyMode::Crc32,
                    _ => {
                        return Err(invalid(format!(
                            "keys={v:?}: write sha256 (the default) or crc32 (Symfony's keys)"
                        )));
                    }
                }
            }
            "keepalive" => config.keepalive = seconds(k, v).map_err(invalid)?,
            "connect_timeout" => config.connect_timeout = seconds(k, v).map_err(invalid)?,
            "statement_timeout" => config.statement_timeout = seconds(k, v).map_err(invalid)?,
            "max_idle" => {
                config.max_idle = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n <= 1000)
                    .ok_or_else(|| invalid(format!("max_idle={v:?}: a number from 0 to 1000")))?;
            }
            _ => unreachable!("only this library's options are read here"),
        }
    }
    let password = url.password().map(str::to_owned);
    config.options = PgConnectOptions::from_str(url.as_str()).map_err(|e| {
        let text = e.to_string();
        invalid(match &password {
            Some(p) if !p.is_empty() && text.contains(p.as_str()) => "refused by the driver".into(),
            _ => text,
        })
    })?;
    config.options = config
        .options
        .application_name("xtr-lock")
        // Advisory statements are few and short: no statement cache to keep per connection.
        .statement_cache_capacity(16);
    config.shown = format!(
        "{scheme}://{}:{}/{}",
        url.host_str().unwrap_or("localhost"),
        url.port().unwrap_or(5432),
        url.path().trim_start_matches('/')
    );
    if config.keys == KeyMode::Crc32 {
        config.shown.push_str("?keys=crc32");
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsns_split_our_options_from_the_drivers() {
        let c = parse(
            "postgresql+advisory://app:s3cret@db.internal:6543/locks?keys=crc32&sslmode=disable&keepalive=0.5",
        )
        .unwrap();
        assert_eq!(c.keys, KeyMode::Crc32);
        assert_eq!(c.keepalive, Duration::from_millis(500));
        assert_eq!(
            c.shown,
            "postgresql+advisory://db.internal:6543/locks?keys=crc32"
        );
        let c = parse("postgres+advisory://u@h/db").unwrap();
        assert_eq!(c.keys, KeyMode::Sha256);
        assert_eq!(c.shown, "postgres+advisory://h:5432/db");
        assert!(is_advisory_dsn("PostgreSQL+Advisory://h/db"));
        assert!(!is_advisory_dsn("postgresql://h/db"));
    }

    #[test]
    fn bad_dsns_say_what_is_wrong_without_the_password() {
        for (dsn, says) in [
            (
                "postgresql+advisory://u:hunter2@h/db?keys=md5",
                "keys=\"md5\"",
            ),
            (
                "postgresql+advisory://u:hunter2@h/db?keepalive=0",
                "keepalive",
            ),
            (
                "postgresql+advisory://u:hunter2@h/db?max_idle=x",
                "max_idle",
            ),
            (
                "postgresql+advisory://u:hunter2@h/db?sslmode=sometimes",
                "invalid postgresql+advisory",
            ),
            (
                "postgresql+advisory://u:hunter2@[h/db",
                "invalid postgresql+advisory",
            ),
        ] {
            let err = parse(dsn).unwrap_err().to_string();
            assert!(err.contains(says), "{dsn}: {err}");
            assert!(!err.contains("hunter2"), "{dsn}: {err}");
        }
    }
}
