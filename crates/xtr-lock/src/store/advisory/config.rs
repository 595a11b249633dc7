//! Session-lock DSNs: `postgresql+advisory://` and `postgres+advisory://` (PostgreSQL advisory
//! locks), `mysql+getlock://` and `mariadb+getlock://` (`GET_LOCK`), with this library's options
//! split off before the rest goes to sqlx.

use std::str::FromStr as _;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;

use super::db::Target;

use super::keys::KeyMode;
use crate::dsn::{Dsn, Options};
use crate::error::Result;
use crate::store::sql::config::{MAX_TIMEOUT, MYSQL_DRIVER, PG_DRIVER, driver_error, set_query};

/// How long to wait for a connection, and for a statement that does not wait for a lock.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a holding session is pinged.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(1);
/// Idle lock connections kept for the next holder.
const DEFAULT_MAX_IDLE: usize = 16;
/// The longest pause between two pings of a holding session: a session that ended is noticed
/// (and the loss reported) at the next ping, so a longer one would report it that much later.
const MAX_KEEPALIVE: Duration = Duration::from_secs(60);

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

/// Parses a session-lock DSN. Errors show the scheme, never a credential.
pub(crate) fn parse(text: &str) -> Result<SessionConfig> {
    let scheme = text.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
    let postgres = match scheme.as_deref() {
        Some("postgres+advisory" | "postgresql+advisory") => true,
        Some("mysql+getlock" | "mariadb+getlock") => false,
        _ => {
            return Err(Dsn::split(text, "session-lock").invalid(
                "write postgresql+advisory://user:password@host:port/database or \
                 mysql+getlock://user:password@host:port/database",
            ));
        }
    };
    let dsn = Dsn::split(
        text,
        if postgres {
            "PostgreSQL advisory-lock"
        } else {
            "MySQL GET_LOCK"
        },
    );
    let driver = if postgres { "postgresql" } else { "mysql" };
    // The URL first, as the SQL store does (a `?` in a password fails as the URL).
    let mut url = url::Url::parse(&format!("{driver}:{}", dsn.rest)).map_err(|e| dsn.invalid(e))?;
    let mut options = dsn.options();
    let mut config = read_options(&dsn, postgres, &mut options)?;
    let theirs = options.pass_through(if postgres { PG_DRIVER } else { MYSQL_DRIVER });
    options.finish()?;
    set_query(&mut url, &theirs);
    config.database = url.path().trim_start_matches('/').to_owned();
    let refused = driver_error(&dsn, url.password());
    config.target = if postgres {
        Target::Postgres(
            PgConnectOptions::from_str(url.as_str())
                .map_err(refused)?
                .application_name("xtr-lock")
                // Lock statements are few and short.
                .statement_cache_capacity(16),
        )
    } else {
        if config.database.is_empty() {
            return Err(dsn.invalid(
                "name the database (mysql+getlock://host/database): lock names are server-wide, \
                 and the database's name keeps two applications' apart",
            ));
        }
        Target::MySql(
            MySqlConnectOptions::from_str(url.as_str())
                .map_err(refused)?
                .statement_cache_capacity(16),
        )
    };
    config.shown = format!(
        "{}://{}:{}/{}",
        dsn.scheme,
        url.host_str().unwrap_or("localhost"),
        url.port().unwrap_or(if postgres { 5432 } else { 3306 }),
        config.database
    );
    if config.keys == KeyMode::Crc32 {
        config.shown.push_str("?keys=crc32");
    }
    Ok(config)
}

/// This library's options (`keys` only for PostgreSQL); the target is filled in by the caller.
fn read_options(
    dsn: &Dsn<'_>,
    postgres: bool,
    options: &mut Options<'_, '_>,
) -> Result<SessionConfig> {
    if !postgres && options.take("keys").is_some() {
        return Err(dsn.invalid(
            "keys= is an option of PostgreSQL advisory locks; MySQL lock names are always \
             SHA-256 digests",
        ));
    }
    let keys = options.choice(
        "keys",
        &[("sha256", KeyMode::Sha256), ("crc32", KeyMode::Crc32)],
        "write sha256 (the default) or crc32 (Symfony's keys)",
    )?;
    Ok(SessionConfig {
        target: Target::Postgres(PgConnectOptions::new()),
        keys: keys.unwrap_or(KeyMode::Sha256),
        database: String::new(),
        keepalive: options.seconds_or("keepalive", MAX_KEEPALIVE, DEFAULT_KEEPALIVE)?,
        connect_timeout: options.seconds_or("connect_timeout", MAX_TIMEOUT, DEFAULT_TIMEOUT)?,
        statement_timeout: options.seconds_or("statement_timeout", MAX_TIMEOUT, DEFAULT_TIMEOUT)?,
        max_idle: options
            .number("max_idle", 0..=1000)?
            .unwrap_or(DEFAULT_MAX_IDLE),
        shown: String::new(),
    })
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
        assert!(parse("PostgreSQL+Advisory://h/db").is_ok());
        assert!(parse("postgresql://h/db").is_err());
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
                "invalid PostgreSQL advisory-lock",
            ),
            (
                "postgresql+advisory://u:hunter2@[h/db",
                "invalid PostgreSQL advisory-lock",
            ),
        ] {
            let err = parse(dsn).unwrap_err().to_string();
            assert!(err.contains(says), "{dsn}: {err}");
            assert!(!err.contains("hunter2"), "{dsn}: {err}");
        }
    }

    #[test]
    fn keys_is_refused_on_mysql_whatever_its_value() {
        let err = parse("mysql+getlock://u@h/db?keys=md5")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("an option of PostgreSQL advisory locks"),
            "{err}"
        );
    }
}
