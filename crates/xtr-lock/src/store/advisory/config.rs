//! Session-lock DSNs: `postgresql+advisory://` and `postgres+advisory://` (PostgreSQL advisory
//! locks), `mysql+getlock://` and `mariadb+getlock://` (`GET_LOCK`), with this library's options
//! split off before the rest goes to sqlx.

use std::str::FromStr as _;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;

use super::db::Target;

use super::keys::KeyMode;
use crate::error::{Error, Result};
use crate::store::sql::config::{MYSQL_DRIVER, PG_DRIVER, check_known, seconds};

/// How long to wait for a connection, and for a statement that does not wait for a lock.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a holding session is pinged.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(1);
/// Idle lock connections kept for the next holder.
const DEFAULT_MAX_IDLE: usize = 16;
/// The longest pause between two pings of a holding session: a session that ended is noticed
/// (and the loss reported) at the next ping, so a longer one would report it that much later.
const MAX_KEEPALIVE: Duration = Duration::from_secs(60);

const OURS: &[&str] = &[
    "keys",
    "keepalive",
    "connect_timeout",
    "statement_timeout",
    "max_idle",
];

/// A parsed session-lock DSN.
#[derive(Debug, Clone)]
pub(crate) struct SessionConfig {
    pub(crate) target: Target,
    pub(crate) keys: KeyMode,
    /// MySQL's lock names are server-wide: the database's name goes into each lock's name.
    pub(crate) database: String,
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

/// Whether `dsn` names the `GET_LOCK` store.
pub(crate) fn is_getlock_dsn(dsn: &str) -> bool {
    let scheme = dsn
        .split_once(':')
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    matches!(scheme.as_str(), "mysql+getlock" | "mariadb+getlock")
}

/// Parses a session-lock DSN. Errors show the scheme, never a credential.
pub(crate) fn parse(dsn: &str) -> Result<SessionConfig> {
    let (scheme, rest) = dsn.split_once(':').unwrap_or((dsn, ""));
    let scheme = scheme.to_ascii_lowercase();
    let invalid = |why: String| {
        Error::invalid_argument(format!("invalid {scheme}: connection string: {why}"))
    };
    let postgres = is_advisory_dsn(dsn);
    if !postgres && !is_getlock_dsn(dsn) {
        return Err(invalid(
            "write postgresql+advisory://user:password@host:port/database or \
             mysql+getlock://user:password@host:port/database"
                .into(),
        ));
    }
    let driver = if postgres { "postgresql" } else { "mysql" };
    let mut url =
        url::Url::parse(&format!("{driver}:{rest}")).map_err(|e| invalid(e.to_string()))?;
    let (ours, theirs): (Vec<_>, Vec<_>) = url
        .query_pairs()
        .into_owned()
        .partition(|(k, _)| OURS.contains(&k.as_str()));
    for (k, _) in &theirs {
        check_known(k, OURS, if postgres { PG_DRIVER } else { MYSQL_DRIVER }).map_err(invalid)?;
    }
    if theirs.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(&theirs);
    }
    let mut config = SessionConfig {
        target: Target::Postgres(PgConnectOptions::new()),
        keys: KeyMode::Sha256,
        database: url.path().trim_start_matches('/').to_owned(),
        keepalive: DEFAULT_KEEPALIVE,
        connect_timeout: DEFAULT_TIMEOUT,
        statement_timeout: DEFAULT_TIMEOUT,
        max_idle: DEFAULT_MAX_IDLE,
        shown: String::new(),
    };
    for (k, v) in &ours {
        match k.as_str() {
            "keys" if !postgres => {
                return Err(invalid(
                    "keys= is an option of PostgreSQL advisory locks; MySQL lock names are \
                     always SHA-256 digests"
                        .into(),
                ));
            }
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
            "keepalive" => {
                config.keepalive = seconds(k, v)
                    .ok()
                    .filter(|s| *s <= MAX_KEEPALIVE)
                    .ok_or_else(|| {
                        invalid(format!(
                            "keepalive={v:?}: seconds between pings of a holding session, more \
                             than 0 and at most {} (a lost session is noticed at the next ping)",
                            MAX_KEEPALIVE.as_secs()
                        ))
                    })?;
            }
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
    let redacted = |e: sqlx::Error| {
        let text = e.to_string();
        invalid(match &password {
            Some(p) if !p.is_empty() && text.contains(p.as_str()) => "refused by the driver".into(),
            _ => text,
        })
    };
    config.target = if postgres {
        Target::Postgres(
            PgConnectOptions::from_str(url.as_str())
                .map_err(redacted)?
                .application_name("xtr-lock")
                // Lock statements are few and short.
                .statement_cache_capacity(16),
        )
    } else {
        if config.database.is_empty() {
            return Err(invalid(
                "name the database (mysql+getlock://host/database): lock names are server-wide, \
                 and the database's name keeps two applications' apart"
                    .into(),
            ));
        }
        Target::MySql(
            MySqlConnectOptions::from_str(url.as_str())
                .map_err(redacted)?
                .statement_cache_capacity(16),
        )
    };
    config.shown = format!(
        "{scheme}://{}:{}/{}",
        url.host_str().unwrap_or("localhost"),
        url.port().unwrap_or(if postgres { 5432 } else { 3306 }),
        config.database
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
                "postgresql+advisory://u:hunter2@h/db?keepalive=3600",
                "at most 60",
            ),
            ("mysql+getlock://u:hunter2@h/db?keepalive=61", "at most 60"),
            (
                "mysql+getlock://u:hunter2@h/db?statment_timeout=1",
                "did you mean \"statement_timeout\"?",
            ),
            (
                "postgresql+advisory://u:hunter2@h/db?key=crc32",
                "did you mean \"keys\"?",
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
