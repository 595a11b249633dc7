//! The tables: checked once per store before its first statement, made when allowed. A missing
//! table or a wrong column is an error that names the table and says what is wrong.

use super::Inner;
use super::dialect::Flavor;
use super::errors::map_error;
use super::queries::{self, Conn};
use crate::error::{Error, Result};

/// Checks the lock table and the fencing table, making them first when `create` allows; whether
/// anything was made.
pub(super) async fn ensure(inner: &Inner, conn: &mut Conn, create: bool) -> Result<bool> {
    let table = &inner.table;
    let fence = format!("{table}_fence");
    let map = |e| map_error(e, inner);
    let mut made = false;
    for (i, name) in [table.as_str(), fence.as_str()].into_iter().enumerate() {
        let mut columns = queries::columns(conn, &inner.sql, name)
            .await
            .map_err(map)?;
        if columns.is_empty() {
            if !create {
                return Err(missing(name, i == 1));
            }
            queries::execute(conn, &inner.sql.create[i])
                .await
                .map_err(map)?;
            made = true;
            columns = queries::columns(conn, &inner.sql, name)
                .await
                .map_err(map)?;
        }
        let wanted: &[(&str, Kind, Option<i64>)] = if i == 0 {
            &[
                ("key_id", Kind::Text, Some(64)),
                ("key_token", Kind::Text, Some(44)),
                ("key_expiration", Kind::Number, None),
            ]
        } else {
            &[("key_id", Kind::Text, Some(64)), ("n", Kind::Number, None)]
        };
        for (column, kind, length) in wanted {
            let Some((_, ty, len)) = columns.iter().find(|(n, _, _)| n == column) else {
                return Err(Error::storage(format!(
                    "table {name} has no column {column}: it is not a lock table of this \
                     layout (key_id, key_token, key_expiration)"
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

fn missing(name: &str, fence: bool) -> Error {
    let what = if fence {
        "the fencing table of this library"
    } else {
        "the lock table"
    };
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
