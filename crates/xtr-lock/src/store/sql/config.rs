//! SQL DSNs: `postgres://`, `postgresql://`, `mysql://`, `mariadb://`, `sqlite:///path`,
//! `sqlite::memory:`, with this library's options split off before the rest goes to sqlx.

use std::str::FromStr as _;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

use crate::dsn::{Dsn, Options as DsnOptions};
use crate::error::{Error, Result};

/// Symfony's table name.
pub(crate) const DEFAULT_TABLE: &str = "lock_keys";

/// How long to wait for a connection, and for one statement, unless the DSN says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections of the store's own pool, unless the DSN says otherwise.
const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// The driver's own options (sqlx's connection-string parameters), per database: an option
/// that is neither one of these nor this library's is refused, never silently dropped.
pub(crate) const PG_DRIVER: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];
pub(crate) const MYSQL_DRIVER: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslca",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "tls-sni-servername",
    "charset",
    "collation",
    "statement-cache-capacity",
    "socket",
    "timezone",
    "time-zone",
];
const SQLITE_DRIVER: &[&str] = &["mode", "cache", "immutable", "vfs"];

/// Which database, with the driver's options.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Postgres(PgConnectOptions),
    MySql(MySqlConnectOptions),
    Sqlite {
        options: SqliteConnectOptions,
        /// `sqlite::memory:`: one connection, kept forever (the database is that connection).
        memory: bool,
    },
}

/// A parsed SQL DSN.
#[derive(Debug, Clone)]
pub(crate) struct SqlConfig {
    pub(crate) target: Target,
    pub(crate) table: String,
    pub(crate) create_table: bool,
    /// Waiters served in arrival order (`fair`, default true); false lets newcomers barge.
    pub(crate) fair: bool,
    pub(crate) connect_timeout: Duration,
    pub(crate) statement_timeout: Duration,
    pub(crate) max_connections: u32,
    /// The DSN without credentials or driver options: what `Display` and errors show.
    pub(crate) shown: String,
}

/// Checks a table name: it is spliced into SQL, so only a plain identifier is accepted.
pub(crate) fn check_table(table: &str) -> Result<()> {
    let mut bytes = table.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if first_ok && table.len() <= 57 && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Ok(());
    }
    Err(Error::invalid_argument(format!(
        "invalid table name {:?}: a letter or underscore, then letters, digits or underscores, \
         at most 57 characters (the fencing table adds `_fence`)",
        table.chars().take(80).collect::<String>()
    )))
}

/// Parses an SQL DSN. Errors show the scheme, never a credential.
pub(crate) fn parse(text: &str) -> Result<SqlConfig> {
    let (what, driver, default_port) = match text
        .split_once(':')
        .map(|(s, _)| s.to_ascii_lowercase())
        .as_deref()
    {
        Some("postgres" | "postgresql") => ("PostgreSQL", PG_DRIVER, 5432),
        Some("mysql" | "mariadb") => ("MySQL", MYSQL_DRIVER, 3306),
        Some("sqlite") => return parse_sqlite(&Dsn::split(text, "SQLite")),
        _ => {
            let dsn = Dsn::split(text, "SQL");
            return Err(dsn.invalid("write postgres://, mysql://, mariadb:// or sqlite:///path"));
        }
    };
    let dsn = Dsn::split(text, what);
    // The URL first: a `?` in a password that was not percent-encoded then fails as the URL
    // (a bad port), never as an "unknown option" named after the rest of the password.
    let mut url = url::Url::parse(text).map_err(|e| dsn.invalid(e))?;
    let mut options = dsn.options();
    let ours = Options::read(&mut options)?;
    let theirs = options.pass_through(driver);
    options.finish()?;
    set_query(&mut url, &theirs);
    let host = url.host_str().unwrap_or("localhost").to_owned();
    let database = url.path().trim_start_matches('/').to_owned();
    let driver_url = match dsn.scheme.as_str() {
        "mariadb" => format!("mysql{}", &url.as_str()["mariadb".len()..]),
        _ => url.as_str().to_owned(),
    };
    let refused = driver_error(&dsn, url.password());
    let target = match default_port {
        5432 => Target::Postgres(PgConnectOptions::from_str(&driver_url).map_err(refused)?),
        _ => Target::MySql(MySqlConnectOptions::from_str(&driver_url).map_err(refused)?),
    };
    let mut shown = format!(
        "{}://{host}:{}/{database}",
        dsn.scheme,
        url.port().unwrap_or(default_port)
    );
    if ours.table != DEFAULT_TABLE {
        shown.push_str(&format!("?table={}", ours.table));
    }
    Ok(ours.into_config(target, shown))
}

/// The driver's options as the URL's query (none: no query).
pub(crate) fn set_query(url: &mut url::Url, theirs: &[(String, String)]) {
    if theirs.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(theirs);
    }
}

/// A driver's refusal as an error about `dsn`, its text dropped if it shows the password.
pub(crate) fn driver_error<'d>(
    dsn: &'d Dsn<'_>,
    password: Option<&str>,
) -> impl Fn(sqlx::Error) -> Error + 'd {
    let password = password.filter(|p| !p.is_empty()).map(str::to_owned);
    move |e: sqlx::Error| {
        let text = e.to_string();
        match &password {
            Some(p) if text.contains(p.as_str()) => dsn.invalid("refused by the driver"),
            _ => dsn.invalid(text),
        }
    }
}

fn parse_sqlite(dsn: &Dsn<'_>) -> Result<SqlConfig> {
    let mut options = dsn.options();
    let ours = Options::read(&mut options)?;
    let theirs = options.pass_through(SQLITE_DRIVER);
    options.finish()?;
    let base = dsn.text.split_once('?').map_or(dsn.text, |(b, _)| b);
    let memory = base.eq_ignore_ascii_case("sqlite::memory:");
    let path = if memory {
        None
    } else {
        let Some(path) = base
            .strip_prefix("sqlite://")
            .or_else(|| base.strip_prefix("SQLITE://"))
        else {
            return Err(dsn.invalid("write sqlite:///absolute/path.db or sqlite::memory:"));
        };
        if !path.starts_with('/') {
            // Each process would resolve it against its own working directory, and two
            // processes started in different directories would silently stop excluding each
            // other.
            return Err(dsn.invalid(format!(
                "{:?} is a relative path, which each process would resolve against its own \
                 working directory: write sqlite:///absolute/path.db",
                path.chars().take(100).collect::<String>()
            )));
        }
        Some(path.to_owned())
    };
    let mut driver = match &path {
        Some(p) => format!("sqlite://{p}"),
        None => "sqlite::memory:".to_owned(),
    };
    if !theirs.is_empty() {
        driver.push('?');
        driver.push_str(
            &url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(&theirs)
                .finish(),
        );
    }
    let sqlite = SqliteConnectOptions::from_str(&driver)
        .map_err(|e| dsn.invalid(e))?
        // A missing file is made (empty): the missing table is then the error, with what to do.
        .create_if_missing(true)
        .busy_timeout(ours.statement_timeout);
    let mut shown = match &path {
        Some(p) => format!("sqlite://{p}"),
        None => "sqlite::memory:".to_owned(),
    };
    if ours.table != DEFAULT_TABLE {
        shown.push_str(&format!("?table={}", ours.table));
    }
    Ok(ours.into_config(
        Target::Sqlite {
            options: sqlite,
            memory,
        },
        shown,
    ))
}

/// The longest timeout a DSN may ask for.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// This library's options, read from a DSN.
struct Options {
    table: String,
    create_table: bool,
    fair: bool,
    connect_timeout: Duration,
    statement_timeout: Duration,
    max_connections: u32,
}

impl Options {
    fn read(options: &mut DsnOptions<'_, '_>) -> Result<Options> {
        let table = options.take("table");
        if let Some(table) = &table {
            check_table(table)?;
        }
        Ok(Options {
            table: table.unwrap_or_else(|| DEFAULT_TABLE.to_owned()),
            create_table: options.flag("create_table")?.unwrap_or(false),
            fair: options.flag("fair")?.unwrap_or(true),
            connect_timeout: options.seconds_or("connect_timeout", MAX_TIMEOUT, DEFAULT_TIMEOUT)?,
            statement_timeout: options.seconds_or(
                "statement_timeout",
                MAX_TIMEOUT,
                DEFAULT_TIMEOUT,
            )?,
            max_connections: options
                .number("max_connections", 1..=1000)?
                .unwrap_or(DEFAULT_MAX_CONNECTIONS),
        })
    }

    fn into_config(self, target: Target, shown: String) -> SqlConfig {
        let memory = matches!(target, Target::Sqlite { memory: true, .. });
        SqlConfig {
            target,
            table: self.table,
            create_table: self.create_table,
            fair: self.fair,
            connect_timeout: self.connect_timeout,
            statement_timeout: self.statement_timeout,
            max_connections: if memory { 1 } else { self.max_connections },
            shown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_is_the_default_and_fair_false_lets_newcomers_barge() {
        assert!(parse("postgres://h/db").unwrap().fair);
        assert!(!parse("postgres://h/db?fair=false").unwrap().fair);
        assert!(!parse("sqlite:///tmp/l.db?fair=false").unwrap().fair);
        let err = parse("mysql://h/db?fair=sometimes")
            .unwrap_err()
            .to_string();
        assert!(err.contains("fair"), "{err}");
    }

    #[test]
    fn dsns_split_our_options_from_the_drivers() {
        let c = parse(
            "postgres://app:s3cret@db.internal:6543/locks?table=my_locks&sslmode=disable&statement_timeout=2",
        )
        .unwrap();
        assert_eq!(c.table, "my_locks");
        assert_eq!(c.statement_timeout, Duration::from_secs(2));
        assert_eq!(c.shown, "postgres://db.internal:6543/locks?table=my_locks");
        assert!(matches!(c.target, Target::Postgres(_)));
        let c = parse("mariadb://root:pw@127.0.0.1/xtr").unwrap();
        assert_eq!(c.shown, "mariadb://127.0.0.1:3306/xtr");
        assert!(matches!(c.target, Target::MySql(_)));
        let c = parse("sqlite:///var/lib/app/locks.db?create_table=true").unwrap();
        assert!(c.create_table);
        assert_eq!(c.shown, "sqlite:///var/lib/app/locks.db");
        let c = parse("sqlite::memory:").unwrap();
        assert_eq!(c.max_connections, 1);
        // The driver's own options still go to it.
        parse("postgres://h/db?sslmode=disable&options[search_path]=locks&application_name=a")
            .unwrap();
        parse("mysql://h/db?ssl-mode=DISABLED&charset=utf8mb4&time-zone=%2B00:00").unwrap();
        parse("sqlite:///x.db?mode=rw&cache=shared").unwrap();
    }

    #[test]
    fn bad_dsns_say_what_is_wrong_without_the_password() {
        for (dsn, says) in [
            (
                "postgres://u:hunter2@h/db?table=drop%20table",
                "invalid table name",
            ),
            (
                "postgres://u:hunter2@h/db?create_table=maybe",
                "create_table",
            ),
            (
                "mysql://u:hunter2@h/db?statement_timeout=-1",
                "statement_timeout",
            ),
            (
                "postgres://u:hunter2@h/db?sslmode=sometimes",
                "invalid PostgreSQL",
            ),
            ("sqlite://relative.db", "relative path"),
            (
                "postgres://u:hunter2@h/db?tabel=x",
                "unknown option \"tabel\"; did you mean \"table\"?",
            ),
            (
                "mysql://u:hunter2@h/db?statment_timeout=1",
                "unknown option \"statment_timeout\"; did you mean \"statement_timeout\"?",
            ),
            (
                "sqlite:///x.db?create_tabel=true",
                "did you mean \"create_table\"?",
            ),
            (
                "postgres://u:hunter2@h/db?frobnicate=1",
                "the driver's sslmode",
            ),
            ("sqlite:/x", "sqlite:///absolute"),
        ] {
            let err = parse(dsn).unwrap_err().to_string();
            assert!(err.contains(says), "{dsn}: {err}");
            assert!(!err.contains("hunter2"), "{dsn}: {err}");
        }
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["lock_keys", "_x", "Locks2"] {
            check_table(ok).unwrap();
        }
        for bad in ["", "1x", "a-b", "a;drop", "a b", &"x".repeat(58)] {
            check_table(bad).unwrap_err();
        }
    }

    #[test]
    fn a_question_mark_in_a_password_never_shows_the_rest_of_it() {
        for dsn in [
            "postgres://u:pa?ss@h/db",
            "mysql://u:pa?ss@h/db",
            "postgresql+advisory://u:pa?ss@h/db",
        ] {
            let err = match crate::StoreFactory::validate(dsn) {
                Err(e) => e.to_string(),
                Ok(()) => panic!("{dsn} accepted"),
            };
            assert!(!err.contains("ss@"), "{dsn}: {err}");
        }
    }
}
