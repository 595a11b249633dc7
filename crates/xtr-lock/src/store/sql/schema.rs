//! The tables: checked once per store before its first statement, made when allowed. A missing
//! table or a wrong column is an error that names the table and says what is wrong.

use super::Inner;
use super::dialect::Flavor;
use super::dialect::holder_table;
use super::errors::map_error;
use super::queries::{self, Conn};
use super::queue_sql::queue_table;
use super::sem_sql::{perm_table, sem_table};
use crate::error::{Error, Result};
use sqlx::AssertSqlSafe;

type Db<T> = std::result::Result<T, sqlx::Error>;

/// A table's columns: name, kind, least length.
type Wanted = &'static [(&'static str, Kind, Option<i64>)];

const LOCKS: Wanted = &[
    ("key_id", Kind::Text, Some(64)),
    ("key_token", Kind::Text, Some(44)),
    ("key_expiration", Kind::Number, None),
];
const FENCE: Wanted = &[("key_id", Kind::Text, Some(64)), ("n", Kind::Number, None)];
const RECORDS: Wanted = &[
    ("key_id", Kind::Text, Some(66)),
    ("token", Kind::Text, Some(44)),
    ("resource", Kind::Text, None),
    ("record", Kind::Text, None),
    ("at_ms", Kind::Number, None),
];
const QUEUE: Wanted = &[
    ("q_id", Kind::Text, Some(66)),
    ("token", Kind::Text, Some(44)),
    ("since_us", Kind::Number, None),
    ("seq", Kind::Number, None),
    ("permits", Kind::Number, None),
    ("expires_ms", Kind::Number, None),
];
const SEMAPHORES: Wanted = &[
    ("sem_id", Kind::Text, Some(64)),
    ("sem_limit", Kind::Number, None),
    ("n", Kind::Number, None),
];
const PERMITS: Wanted = &[
    ("sem_id", Kind::Text, Some(64)),
    ("token", Kind::Text, Some(44)),
    ("permits", Kind::Number, None),
    ("expiration", Kind::Number, None),
];

/// Checks the lock table, the fencing table, the holders' records and (on a fair store) the
/// queue, making them first when `create` allows; whether anything was made.
pub(super) async fn ensure(inner: &Inner, conn: &mut Conn, create: bool) -> Result<bool> {
    let table = &inner.table;
    let tables = [
        (table.clone(), &inner.sql.create[0], LOCKS, "the lock table"),
        (
            format!("{table}_fence"),
            &inner.sql.create[1],
            FENCE,
            "the fencing table of this library",
        ),
        (
            holder_table(table),
            &inner.rec.create,
            RECORDS,
            "the holders' records of this library",
        ),
    ];
    let made = ensure_tables(inner, conn, create, &tables).await?;
    let Some(queue) = &inner.queue else {
        return Ok(made);
    };
    let what = "the fair queue of this library";
    let tables = [(queue_table(table), &queue.create, QUEUE, what)];
    let queued = ensure_tables(inner, conn, create, &tables)
        .await
        .map_err(|e| {
            // A database made by an older version: migrate, or wait unfairly without it.
            if e.to_string().contains("does not exist") {
                Error::storage(format!(
                    "{what} {} does not exist: make it with `xtr-lock migrate --store <DSN>` (or \
                 add ?create_table=true, or ?fair=false to wait unfairly without it)",
                    queue_table(table)
                ))
            } else {
                e
            }
        })?;
    Ok(made || queued)
}

/// Checks the semaphores' tables (`<table>_sem`, `<table>_perm`), making them first when
/// `create` allows; whether anything was made. Checked on a store's first semaphore operation,
/// so a database used only for locks needs none of them.
pub(super) async fn ensure_semaphores(
    inner: &Inner,
    conn: &mut Conn,
    create: bool,
) -> Result<bool> {
    let table = &inner.table;
    let tables = [
        (
            sem_table(table),
            &inner.sem.create[0],
            SEMAPHORES,
            "the semaphores' table of this library",
        ),
        (
            perm_table(table),
            &inner.sem.create[1],
            PERMITS,
            "the semaphore holders' table of this library",
        ),
    ];
    ensure_tables(inner, conn, create, &tables).await
}

async fn ensure_tables(
    inner: &Inner,
    conn: &mut Conn,
    create: bool,
    tables: &[(String, &String, Wanted, &str)],
) -> Result<bool> {
    let map = |e| map_error(e, inner);
    let mut made = false;
    for (name, ddl, wanted, what) in tables {
        let mut columns = table_columns(conn, &inner.sql, name).await.map_err(map)?;
        if columns.is_empty() {
            if !create {
                return Err(missing(name, what));
            }
            queries::execute(conn, ddl).await.map_err(map)?;
            made = true;
            columns = table_columns(conn, &inner.sql, name).await.map_err(map)?;
        }
        for (column, kind, length) in *wanted {
            let Some((_, ty, len)) = columns.iter().find(|(n, _, _)| n == column) else {
                let all: Vec<&str> = wanted.iter().map(|w| w.0).collect();
                return Err(Error::storage(format!(
                    "table {name} has no column {column}: it is not {what} of this layout ({})",
                    all.join(", ")
                )));
            };
            if !kind.accepts(ty, inner.flavor) {
                return Err(Error::storage(format!(
                    "column {column} of table {name} is {ty}, not {}",
                    kind.name()
                )));
            }
            if let (Some(want), Some(have)) = (length, len)
                && have < want
            {
                return Err(Error::storage(format!(
                    "column {column} of table {name} holds {have} characters, fewer than the \
                     {want} it needs"
                )));
            }
        }
    }
    Ok(made)
}

fn missing(name: &str, what: &str) -> Error {
    Error::storage(format!(
        "{what} {name} does not exist: make it with `xtr-lock migrate --store <DSN>` (or add \
         ?create_table=true to the DSN)"
    ))
}

#[derive(Clone, Copy)]
enum Kind {
    Text,
    Number,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Text => "a character type",
            Kind::Number => "a number type",
        }
    }

    fn accepts(self, ty: &str, flavor: Flavor) -> bool {
        // SQLite keeps what a column was declared with, possibly nothing at all.
        if flavor == Flavor::Sqlite && ty.is_empty() {
            return true;
        }
        match self {
            Kind::Text => ty.contains("char") || ty.contains("text"),
            Kind::Number => ["int", "numeric", "decimal", "double", "real", "float"]
                .iter()
                .any(|t| ty.contains(t)),
        }
    }
}

/// The columns of `table`: name (lowercase), type (lowercase), length.
pub(super) async fn table_columns(
    conn: &mut Conn,
    sql: &super::dialect::Sql,
    table: &str,
) -> Db<Vec<(String, String, Option<i64>)>> {
    let q = AssertSqlSafe(sql.columns.as_str());
    let rows: Vec<(String, String, Option<i64>)> = match conn {
        // Unquoted names are folded to lowercase by PostgreSQL.
        Conn::Postgres(p) => {
            sqlx::query_as(q)
                .bind(table.to_ascii_lowercase())
                .fetch_all(&mut **p)
                .await?
        }
        Conn::MySql(p) => sqlx::query_as(q).bind(table).fetch_all(&mut **p).await?,
        Conn::Sqlite(p) => sqlx::query_as(q).bind(table).fetch_all(&mut **p).await?,
    };
    Ok(rows
        .into_iter()
        .map(|(n, t, l)| (n.to_ascii_lowercase(), t.to_ascii_lowercase(), l))
        .collect())
}
