//! Every SQL text of the table store's semaphores, per database: two tables of our own beside
//! the lock table, never Symfony's `lock_keys`.
//!
//! - `<table>_sem`: one row per semaphore (`sem_id` = SHA-256 hex of its name, `sem_limit`,
//!   `n` = its fencing counter). An admission locks it (`FOR UPDATE`; SQLite's write
//!   transaction), so admissions of one semaphore run one at a time.
//! - `<table>_perm`: one row per holder (`sem_id`, `token`, `permits`, `expiration` in whole
//!   Unix seconds on the database's clock, as the lock table's).
//!
//! Each text binds its parameters in the order they appear (written with `?`; PostgreSQL's are
//! numbered here), so one call binds them the same way on every database.

use super::dialect::{Flavor, holder_table, numbered};

/// The statements of one semaphore layout on one database.
#[derive(Debug)]
pub(crate) struct SemSql {
    /// Makes the semaphore's row if it is missing (id, limit).
    pub(crate) ensure: String,
    /// Locks the semaphore's row: its limit and fencing counter (id).
    pub(crate) lock: String,
    /// Deletes the semaphore's expired holders (id).
    pub(crate) purge: String,
    /// The live holders: token, permits, milliseconds left (id).
    pub(crate) list: String,
    /// Sets the stored limit (limit, id).
    pub(crate) set_limit: String,
    /// Sets the fencing counter (n, id).
    pub(crate) set_n: String,
    /// A new holder (id, token, permits, ttl).
    pub(crate) insert: String,
    /// Extends our own live row (ttl, id, token).
    pub(crate) refresh: String,
    /// Our row: 1 while live, 0 once expired (id, token).
    pub(crate) own: String,
    /// Deletes our row while live (id, token); PostgreSQL also notifies (id, token, channel,
    /// payload) and answers whether a live row went.
    pub(crate) delete: String,
    /// Deletes our row, live or not (id, token).
    pub(crate) delete_any: String,
    /// The live holders and the stored limit: token, permits, milliseconds left, limit (id).
    pub(crate) usage: String,
    /// Up to 100 holder rows expired for more than a second.
    pub(crate) prune: String,
    /// The DDL: the semaphores' table, then the holders'.
    pub(crate) create: [String; 2],
}

/// The table of the semaphores' rows, beside `table`.
pub(crate) fn sem_table(table: &str) -> String {
    format!("{table}_sem")
}

/// The table of the holders' rows, beside `table`.
pub(crate) fn perm_table(table: &str) -> String {
    format!("{table}_perm")
}

/// The clock expressions of one database: now in whole seconds, now with fractions, the
/// clock in microseconds, the integer type of a cast, the `FOR UPDATE` of a locking read.
struct Clock {
    now: &'static str,
    fine: &'static str,
    micros: &'static str,
    int: &'static str,
    for_update: &'static str,
}

fn clock(flavor: Flavor) -> Clock {
    match flavor {
        Flavor::Postgres => Clock {
            now: "CAST(EXTRACT(epoch FROM statement_timestamp()) AS BIGINT)",
            // Rows become takeable half a second early (the clock rounds), as the lock table's.
            fine: "(EXTRACT(epoch FROM statement_timestamp()) + 0.5)",
            micros: "CAST(EXTRACT(epoch FROM statement_timestamp()) * 1000000 AS BIGINT)",
            int: "BIGINT",
            for_update: " FOR UPDATE",
        },
        Flavor::MySql => Clock {
            now: "UNIX_TIMESTAMP()",
            fine: "UNIX_TIMESTAMP(NOW(6))",
            micros: "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)",
            int: "SIGNED",
            for_update: " FOR UPDATE",
        },
        Flavor::Sqlite => Clock {
            now: "CAST(strftime('%s','now') AS INTEGER)",
            fine: "((julianday('now') - 2440587.5) * 86400.0)",
            micros: "CAST(((julianday('now') - 2440587.5) * 86400.0) * 1000000 AS INTEGER)",
            int: "INTEGER",
            // The write transaction (BEGIN IMMEDIATE) already holds the database.
            for_update: "",
        },
    }
}

/// A holder's release (answering whether it held, and notifying on PostgreSQL) and the
/// unconditional delete, each taking the holder's record with it: in the same statement
/// (SQLite's in a second one, in-process).
fn deletes(flavor: Flavor, p: &str, rec: &str, now: &str) -> (String, String) {
    // The holder's record goes in the same statement (SQLite's in a second one, in-process).
    let delete = match flavor {
        // The notification goes out at commit, and only when a row went. Written numbered:
        // the record's delete reuses the first two parameters.
        Flavor::Postgres => format!(
            "WITH d AS (DELETE FROM {p} WHERE sem_id = $1 AND token = $2 RETURNING expiration), \
             r AS (DELETE FROM {rec} WHERE key_id = 's:' || $1 AND token = $2) \
             SELECT CAST(CASE WHEN d.expiration > {now} THEN 1 ELSE 0 END AS BIGINT), \
             pg_notify($3, $4) FROM d"
        ),
        Flavor::MySql => format!(
            "DELETE p, x FROM {p} p LEFT JOIN {rec} x \
             ON x.key_id = CONCAT('s:', p.sem_id) AND x.token = p.token \
             WHERE p.sem_id = ? AND p.token = ? AND p.expiration > {now}"
        ),
        Flavor::Sqlite => {
            format!("DELETE FROM {p} WHERE sem_id = ? AND token = ? AND expiration > {now}")
        }
    };
    let delete_any = match flavor {
        Flavor::MySql => format!(
            "DELETE p, x FROM {p} p LEFT JOIN {rec} x \
             ON x.key_id = CONCAT('s:', p.sem_id) AND x.token = p.token \
             WHERE p.sem_id = ? AND p.token = ?"
        ),
        _ => format!("DELETE FROM {p} WHERE sem_id = ? AND token = ?"),
    };
    (delete, delete_any)
}

impl SemSql {
    pub(crate) fn new(flavor: Flavor, table: &str) -> SemSql {
        let (s, p) = (sem_table(table), perm_table(table));
        let Clock {
            now,
            fine,
            micros,
            int,
            for_update,
        } = clock(flavor);
        let left = format!("CAST((expiration - {fine}) * 1000 AS {int})");
        let ensure = match flavor {
            Flavor::MySql => format!(
                "INSERT INTO {s} (sem_id, sem_limit, n) VALUES (?, ?, {micros}) \
                 ON DUPLICATE KEY UPDATE sem_id = sem_id"
            ),
            _ => format!(
                "INSERT INTO {s} (sem_id, sem_limit, n) VALUES (?, ?, {micros}) \
                 ON CONFLICT (sem_id) DO NOTHING"
            ),
        };
        let rec = holder_table(table);
        let sem_key = match flavor {
            Flavor::MySql => "CONCAT('s:', h.sem_id)",
            _ => "'s:' || h.sem_id",
        };
        let (delete, delete_any) = deletes(flavor, &p, &rec, now);
        let prune = if flavor == Flavor::MySql {
            format!("DELETE FROM {p} WHERE expiration < {now} - 1 LIMIT 100")
        } else {
            // The outer condition is checked again on a row changed meanwhile (refreshed).
            format!(
                "DELETE FROM {p} WHERE (sem_id, token) IN (SELECT sem_id, token FROM {p} \
                 WHERE expiration < {now} - 1 LIMIT 100) AND expiration < {now} - 1"
            )
        };
        let sql = SemSql {
            ensure,
            lock: format!("SELECT sem_limit, n FROM {s} WHERE sem_id = ?{for_update}"),
            purge: format!("DELETE FROM {p} WHERE sem_id = ? AND expiration <= {now}"),
            list: format!(
                "SELECT token, permits, {left} FROM {p} WHERE sem_id = ? AND expiration > {now}"
            ),
            set_limit: format!("UPDATE {s} SET sem_limit = ? WHERE sem_id = ?"),
            set_n: format!("UPDATE {s} SET n = ? WHERE sem_id = ?"),
            insert: format!(
                "INSERT INTO {p} (sem_id, token, permits, expiration) VALUES (?, ?, ?, {now} + ?)"
            ),
            refresh: format!(
                "UPDATE {p} SET expiration = {now} + ? \
                 WHERE sem_id = ? AND token = ? AND expiration > {now}"
            ),
            own: format!(
                "SELECT CAST(CASE WHEN expiration > {now} THEN 1 ELSE 0 END AS {int}) \
                 FROM {p} WHERE sem_id = ? AND token = ?"
            ),
            delete,
            delete_any,
            usage: format!(
                "SELECT h.token, h.permits, CAST((h.expiration - {fine}) * 1000 AS {int}), \
                 s.sem_limit, x.record, x.at_ms FROM {p} h JOIN {s} s ON s.sem_id = h.sem_id \
                 LEFT JOIN {rec} x ON x.key_id = {sem_key} AND x.token = h.token \
                 WHERE h.sem_id = ? AND h.expiration > {now}"
            ),
            prune,
            create: create(flavor, &s, &p),
        };
        if flavor == Flavor::Postgres {
            sql.numbered()
        } else {
            sql
        }
    }

    /// PostgreSQL's parameters are numbered: `?` becomes `$1`, `$2`, … in each text.
    fn numbered(self) -> SemSql {
        let n = |text: String| numbered(&text);
        SemSql {
            ensure: n(self.ensure),
            lock: n(self.lock),
            purge: n(self.purge),
            list: n(self.list),
            set_limit: n(self.set_limit),
            set_n: n(self.set_n),
            insert: n(self.insert),
            refresh: n(self.refresh),
            own: n(self.own),
            delete: n(self.delete),
            delete_any: n(self.delete_any),
            usage: n(self.usage),
            prune: self.prune,
            create: self.create,
        }
    }
}

fn create(flavor: Flavor, s: &str, p: &str) -> [String; 2] {
    let (text, int, tail) = match flavor {
        Flavor::Postgres => ("VARCHAR(64)", "BIGINT", ""),
        Flavor::MySql => (
            "VARCHAR(64)",
            "BIGINT",
            " COLLATE utf8mb4_bin, ENGINE = InnoDB",
        ),
        Flavor::Sqlite => ("TEXT", "INTEGER", ""),
    };
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {s} (sem_id {text} NOT NULL PRIMARY KEY, \
             sem_limit {int} NOT NULL, n {int} NOT NULL){tail}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {p} (sem_id {text} NOT NULL, token {text} NOT NULL, \
             permits {int} NOT NULL, expiration {int} NOT NULL, PRIMARY KEY (sem_id, token))\
             {tail}"
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_parameters_are_numbered_in_order() {
        let sql = SemSql::new(Flavor::Postgres, "lock_keys");
        assert!(sql.insert.contains("VALUES ($1, $2, $3,"), "{}", sql.insert);
        assert!(sql.refresh.contains("+ $1") && sql.refresh.contains("token = $3"));
        assert!(sql.delete.contains("pg_notify($3, $4)"), "{}", sql.delete);
        assert!(!SemSql::new(Flavor::MySql, "t").insert.contains('$'));
    }
}
