//! SQL DSNs: `postgres://`, `postgresql://`, `mysql://`, `mariadb://`, `sqlite:///path`,
//! `sqlite::memory:`, with this library's options split off before the rest goes to sqlx.

use std::str::FromStr as _;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

use crate::error::{Error, Result};

/// Symfony's table name.
pub(crate) const DEFAULT_TABLE: &str = "lock_keys";

/// How long to wait for a connection, and for one statement, unless the DSN says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections of the store's own pool, unless the DSN says otherwise.
const DEFAULT_MAX_CONNECTIONS: u32 = 10;

/// The options this library reads itself; every other option goes to the driver.
const OURS: &[&str] = &[
    "table",
    "create_table",
    "connect_timeout",
    "statement_timeout",
    "max_connections",
];

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

/// Refuses `name` unless it is one of `ours` or of the `driver`'s options (PostgreSQL's
/// `options[...]` too), naming it and, when one is close, the option it most likely meant.
pub(crate) fn check_known(
    name: &str,
    ours: &[&str],
    driver: &[&str],
) -> std::result::Result<(), String> {
    let known = |n: &str| ours.contains(&n) || driver.contains(&n);
    if known(name) || (driver.contains(&"options") && name.starts_with("options[")) {
        return Ok(());
    }
    let shown: String = name.chars().take(40).collect();
    let meant = ours
        .iter()
        .chain(driver)
        .map(|k| (edits(name, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min();
    Err(match meant {
        Some((_, k)) => format!("unknown option {shown:?}; did you mean {k:?}?"),
        None => format!(
            "unknown option {shown:?}; this library's options are {}, and the driver's {}",
            ours.join(", "),
            driver.join(", ")
        ),
    })
}

/// The edit distance of two short names (insertions, deletions, substitutions, and a swap of
/// two neighbours counted as one).
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().take(64).collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

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
    pub(crate) connect_timeout: Duration,
    pub(crate) statement_timeout: Duration,
    pub(crate) max_connections: u32,
    /// The DSN without credentials or driver options: what `Display` and errors show.
    pub(crate) shown: String,
}

/// Whether `dsn` names an SQL store (its scheme; the rest is checked by [`parse`]).
pub(crate) fn is_sql_dsn(dsn: &str) -> bool {
    let scheme = dsn
        .split_once(':')
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    matches!(
        scheme.as_str(),
        "postgres" | "postgresql" | "mysql" | "mariadb" | "sqlite"
    )
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
pub(crate) fn parse(dsn: &str) -> Result<SqlConfig> {
    let (scheme, _) = dsn.split_once(':').unwrap_or((dsn, ""));
    let scheme = scheme.to_ascii_lowercase();
    if scheme == "sqlite" {
        return parse_sqlite(dsn);
    }
    let invalid = |why: String| {
        Error::invalid_argument(format!("invalid {scheme}: connection string: {why}"))
    };
    let mut url = url::Url::parse(dsn).map_err(|e| invalid(e.to_string()))?;
    let (ours, theirs) = split_options(&url);
    let driver = match scheme.as_str() {
        "postgres" | "postgresql" => PG_DRIVER,
        _ => MYSQL_DRIVER,
    };
    for (k, _) in &theirs {
        check_known(k, OURS, driver).map_err(invalid)?;
    }
    let options = Options::read(&ours).map_err(invalid)?;
    if theirs.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(&theirs);
    }
    let host = url.host_str().unwrap_or("localhost").to_owned();
    let port = url.port();
    let database = url.path().trim_start_matches('/').to_owned();
    let driver_url = match scheme.as_str() {
        "mariadb" => format!("mysql{}", &url.as_str()["mariadb".len()..]),
        _ => url.as_str().to_owned(),
    };
    let password = url.password().map(str::to_owned);
    let redacted = |e: sqlx::Error| {
        let text = e.to_string();
        match &password {
            Some(p) if !p.is_empty() && text.contains(p.as_str()) => "refused by the driver".into(),
            _ => text,
        }
    };
    let (target, default_port) = match scheme.as_str() {
        "postgres" | "postgresql" => (
            Target::Postgres(
                PgConnectOptions::from_str(&driver_url).map_err(|e| invalid(redacted(e)))?,
            ),
            5432,
        ),
        _ => (
            Target::MySql(
                MySqlConnectOptions::from_str(&driver_url).map_err(|e| invalid(redacted(e)))?,
            ),
            3306,
        ),
    };
    let mut shown = format!(
        "{scheme}://{host}:{}/{database}",
        port.unwrap_or(default_port)
    );
    if options.table != DEFAULT_TABLE {
        shown.push_str(&format!("?table={}", options.table));
    }
    Ok(options.into_config(target, shown))
}

fn parse_sqlite(dsn: &str) -> Result<SqlConfig> {
    let invalid =
        |why: String| Error::invalid_argument(format!("invalid sqlite: connection string: {why}"));
    let (base, query) = dsn.split_once('?').unwrap_or((dsn, ""));
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let (ours, theirs): (Vec<_>, Vec<_>) = pairs
        .into_iter()
        .partition(|(k, _)| OURS.contains(&k.as_str()));
    for (k, _) in &theirs {
        check_known(k, OURS, SQLITE_DRIVER).map_err(invalid)?;
    }
    let options = Options::read(&ours).map_err(invalid)?;
    let memory = base.eq_ignore_ascii_case("sqlite::memory:");
    let path = if memory {
        None
    } else {
        let Some(path) = base
            .strip_prefix("sqlite://")
            .or_else(|| base.strip_prefix("SQLITE://"))
        else {
            return Err(invalid(
                "write sqlite:///absolute/path.db or sqlite::memory:".to_owned(),
            ));
        };
        if !path.starts_with('/') {
            // Each process would resolve it against its own working directory, and two
            // processes started in different directories would silently stop excluding each
            // other.
            return Err(invalid(format!(
                "{:?} is a relative path, which each process would resolve against its own \
                 working directory: write sqlite:///absolute/path.db",
                path.chars().take(100).collect::<String>()
            )));
        }
        Some(path.to_owned())
    };
    let mut driver = String::from(if memory {
        "sqlite::memory:"
    } else {
        "sqlite://"
    });
    if let Some(p) = &path {
        driver.push_str(p);
    }
    if !theirs.is_empty() {
        driver.push('?');
        driver.push_str(
            &url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(&theirs)
                .finish(),
        );
    }
    let sqlite = SqliteConnectOptions::from_str(&driver)
        .map_err(|e| invalid(e.to_string()))?
        // A missing file is made (empty): the missing table is then the error, with what to do.
        .create_if_missing(true)
        .busy_timeout(options.statement_timeout);
    let mut shown = match &path {
        Some(p) => format!("sqlite://{p}"),
        None => "sqlite::memory:".to_owned(),
    };
    if options.table != DEFAULT_TABLE {
        shown.push_str(&format!("?table={}", options.table));
    }
    Ok(options.into_config(
        Target::Sqlite {
            options: sqlite,
            memory,
        },
        shown,
    ))
}

/// This library's options, read from a DSN.
struct Options {
    table: String,
    create_table: bool,
    connect_timeout: Duration,
    statement_timeout: Duration,
    max_connections: u32,
}

impl Options {
    fn read(pairs: &[(String, String)]) -> std::result::Result<Options, String> {
        let mut out = Options {
            table: DEFAULT_TABLE.to_owned(),
            create_table: false,
            connect_timeout: DEFAULT_TIMEOUT,
            statement_timeout: DEFAULT_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        };
        for (k, v) in pairs {
            match k.as_str() {
                "table" => {
                    check_table(v).map_err(|e| e.to_string())?;
                    out.table = v.clone();
                }
                "create_table" => {
                    out.create_table = match v.as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => return Err(format!("create_table={v:?}: write true or false")),
                    }
                }
                "connect_timeout" => out.connect_timeout = seconds(k, v)?,
                "statement_timeout" => out.statement_timeout = seconds(k, v)?,
                "max_connections" => {
                    out.max_connections = v
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| {
                        format!("max_connections={v:?}: a number from 1 to 1000")
                    })?
                }
                _ => unreachable!("only this library's options are read here"),
            }
        }
        Ok(out)
    }

    fn into_config(self, target: Target, shown: String) -> SqlConfig {
        let memory = matches!(target, Target::Sqlite { memory: true, .. });
        SqlConfig {
            target,
            table: self.table,
            create_table: self.create_table,
            connect_timeout: self.connect_timeout,
            statement_timeout: self.statement_timeout,
            max_connections: if memory { 1 } else { self.max_connections },
            shown,
        }
    }
}

pub(crate) fn seconds(key: &str, value: &str) -> std::result::Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{key}={value:?}: seconds, more than 0 and at most 3600"))
}

/// Query options, in order.
type Pairs = Vec<(String, String)>;

/// Splits a URL's query into this library's options and the driver's.
fn split_options(url: &url::Url) -> (Pairs, Pairs) {
    url.query_pairs()
        .into_owned()
        .partition(|(k, _)| OURS.contains(&k.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
                "invalid postgres",
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
}
