//! Every SQL text of the holders' records (`<table>_holder`), per database: one row per holder
//! of a lock (`key_id` as the lock table's) or of a semaphore's permits (`s:` and the
//! semaphore's `sem_id`), keyed by `key_id` and token, with the resource's name, the encoded
//! [`HolderRecord`](crate::meta::HolderRecord) and the acquisition time on the database's
//! clock. Symfony never reads it; a record counts only while the row it describes is live and
//! its own (the reads join on both), and the sweep removes the ones left behind.
//!
//! Texts bind their parameters in the order they appear (written with `?`; PostgreSQL's are
//! numbered, as the semaphores' are).

use super::dialect::{Flavor, numbered};
use super::sem_sql::{perm_table, sem_table};

/// The statements of the holders' records beside one lock table, on one database.
#[derive(Debug)]
pub(crate) struct HolderSql {
    /// Writes a holder's record (id, token, resource, record, new: 1 resets the acquisition
    /// time, 0 keeps it).
    pub(crate) upsert: String,
    /// Deletes a holder's record (id, token): SQLite's release (the others delete in the
    /// releasing statement).
    pub(crate) delete: String,
    /// The live, named lock holders under a prefix: resource, token, milliseconds left,
    /// record, acquired (ms), fencing counter (pattern).
    pub(crate) list_locks: String,
    /// The live lock rows without a record of ours (a Symfony holder): `key_id`, token,
    /// milliseconds left (all: 1 for every one, id: the one resource named).
    pub(crate) list_unnamed: String,
    /// The live, named semaphore holders under a prefix: resource, token, permits,
    /// milliseconds left, record, acquired (ms), limit (pattern).
    pub(crate) list_permits: String,
    /// Up to 100 records of locks no longer held by their holder.
    pub(crate) prune: String,
    /// Up to 100 records of permits no longer held (once the semaphores' tables exist).
    pub(crate) prune_permits: String,
    /// The DDL of the records' table.
    pub(crate) create: String,
}

/// The escape character of `LIKE` patterns: a plain one, the same in every dialect's strings.
const ESCAPE: char = '!';

/// The `LIKE` pattern of every name starting with `prefix` (`%`, `_` and the escape character
/// match themselves). SQLite compares the prefix itself (its `LIKE` ignores case).
pub(crate) fn prefix_pattern(flavor: Flavor, prefix: &str) -> String {
    if flavor == Flavor::Sqlite {
        return prefix.to_owned();
    }
    let mut out = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '%' | '_') || c == ESCAPE {
            out.push(ESCAPE);
        }
        out.push(c);
    }
    out.push('%');
    out
}

struct Dialect {
    now: &'static str,
    fine: &'static str,
    millis: &'static str,
    int: &'static str,
    /// `s:` and a permit's `sem_id`.
    sem_key: &'static str,
    /// The prefix condition on `x.resource` (one parameter).
    under: &'static str,
}

fn dialect(flavor: Flavor) -> Dialect {
    match flavor {
        Flavor::Postgres => Dialect {
            now: "CAST(EXTRACT(epoch FROM statement_timestamp()) AS INT)",
            fine: "(EXTRACT(epoch FROM statement_timestamp()) + 0.5)",
            millis: "CAST(EXTRACT(epoch FROM statement_timestamp()) * 1000 AS BIGINT)",
            int: "BIGINT",
            sem_key: "'s:' || p.sem_id",
            under: "x.resource LIKE ? ESCAPE '!'",
        },
        Flavor::MySql => Dialect {
            now: "UNIX_TIMESTAMP()",
            fine: "UNIX_TIMESTAMP(NOW(6))",
            millis: "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
            int: "SIGNED",
            sem_key: "CONCAT('s:', p.sem_id)",
            under: "x.resource LIKE ? ESCAPE '!'",
        },
        Flavor::Sqlite => Dialect {
            now: "CAST(strftime('%s','now') AS INTEGER)",
            fine: "((julianday('now') - 2440587.5) * 86400.0)",
            millis: "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            int: "INTEGER",
            sem_key: "'s:' || p.sem_id",
            // `LIKE` ignores case on SQLite: the name starts with the prefix itself.
            under: "instr(x.resource, ?) = 1",
        },
    }
}

impl HolderSql {
    pub(crate) fn new(flavor: Flavor, table: &str) -> HolderSql {
        let (t, h, f) = (
            table,
            super::dialect::holder_table(table),
            format!("{table}_fence"),
        );
        let (p, s) = (perm_table(table), sem_table(table));
        let Dialect {
            now,
            fine,
            millis,
            int,
            sem_key,
            under,
        } = dialect(flavor);
        let upsert = upsert(flavor, &h, millis);
        let left = |col: &str| format!("CAST(({col} - {fine}) * 1000 AS {int})");
        let (lock_left, perm_left) = (left("l.key_expiration"), left("p.expiration"));
        let sql = HolderSql {
            upsert,
            delete: format!("DELETE FROM {h} WHERE key_id = ? AND token = ?"),
            list_locks: format!(
                "SELECT x.resource, l.key_token, {lock_left}, x.record, x.at_ms, \
                 CAST(g.n AS {int}) FROM {t} l \
                 JOIN {h} x ON x.key_id = l.key_id AND x.token = l.key_token \
                 LEFT JOIN {f} g ON g.key_id = l.key_id \
                 WHERE l.key_expiration > {now} AND {under}"
            ),
            list_unnamed: format!(
                "SELECT l.key_id, l.key_token, {lock_left} FROM {t} l \
                 WHERE l.key_expiration > {now} AND (? = 1 OR l.key_id = ?) AND NOT EXISTS \
                 (SELECT 1 FROM {h} x WHERE x.key_id = l.key_id AND x.token = l.key_token)"
            ),
            list_permits: format!(
                "SELECT x.resource, p.token, p.permits, {perm_left}, x.record, x.at_ms, \
                 s.sem_limit FROM {p} p \
                 JOIN {h} x ON x.key_id = {sem_key} AND x.token = p.token \
                 JOIN {s} s ON s.sem_id = p.sem_id \
                 WHERE p.expiration > {now} AND {under}"
            ),
            prune: prune(flavor, &h, |x| {
                format!(
                    "{x}.key_id NOT LIKE 's:%' AND NOT EXISTS (SELECT 1 FROM {t} l \
                     WHERE l.key_id = {x}.key_id AND l.key_token = {x}.token \
                     AND l.key_expiration >= {now} - 1)"
                )
            }),
            prune_permits: prune(flavor, &h, |x| {
                format!(
                    "{x}.key_id LIKE 's:%' AND NOT EXISTS (SELECT 1 FROM {p} p \
                     WHERE {sem_key} = {x}.key_id AND p.token = {x}.token \
                     AND p.expiration >= {now} - 1)"
                )
            }),
            create: create(flavor, &h),
        };
        if flavor == Flavor::Postgres {
            sql.numbered()
        } else {
            sql
        }
    }

    /// PostgreSQL's parameters are numbered: `?` becomes `$1`, `$2`, … in each text that has
    /// parameters.
    fn numbered(self) -> HolderSql {
        HolderSql {
            upsert: numbered(&self.upsert),
            delete: numbered(&self.delete),
            list_locks: numbered(&self.list_locks),
            list_unnamed: numbered(&self.list_unnamed),
            list_permits: numbered(&self.list_permits),
            ..self
        }
    }
}

/// A holder's record written or rewritten (its acquisition time kept unless the last
/// parameter is 1: a new acquisition).
fn upsert(flavor: Flavor, h: &str, millis: &str) -> String {
    match flavor {
        Flavor::MySql => format!(
            "INSERT INTO {h} (key_id, token, resource, record, at_ms) \
             VALUES (?, ?, ?, ?, {millis}) ON DUPLICATE KEY UPDATE \
             resource = VALUES(resource), record = VALUES(record), \
             at_ms = IF(? = 1, VALUES(at_ms), at_ms)"
        ),
        _ => format!(
            "INSERT INTO {h} AS x (key_id, token, resource, record, at_ms) \
             VALUES (?, ?, ?, ?, {millis}) ON CONFLICT (key_id, token) DO UPDATE \
             SET resource = EXCLUDED.resource, record = EXCLUDED.record, \
             at_ms = CASE WHEN ? = 1 THEN EXCLUDED.at_ms ELSE x.at_ms END"
        ),
    }
}

/// Deletes up to 100 records that `stale` (of the qualifier naming the records' table) says
/// are left behind. MySQL deletes with a limit but no alias; the others pick the rows first.
fn prune(flavor: Flavor, h: &str, stale: impl Fn(&str) -> String) -> String {
    match flavor {
        Flavor::MySql => format!("DELETE FROM {h} WHERE {} LIMIT 100", stale(h)),
        _ => format!(
            "DELETE FROM {h} WHERE (key_id, token) IN \
             (SELECT x.key_id, x.token FROM {h} x WHERE {} LIMIT 100)",
            stale("x")
        ),
    }
}

fn create(flavor: Flavor, h: &str) -> String {
    let (id, text, int, tail) = match flavor {
        Flavor::Postgres => ("VARCHAR(66)", "TEXT", "BIGINT", ""),
        Flavor::MySql => (
            "VARCHAR(66)",
            "TEXT",
            "BIGINT",
            " COLLATE utf8mb4_bin, ENGINE = InnoDB",
        ),
        Flavor::Sqlite => ("TEXT", "TEXT", "INTEGER", ""),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {h} (key_id {id} NOT NULL, token {id} NOT NULL, \
         resource {text} NOT NULL, record {text} NOT NULL, at_ms {int} NOT NULL, \
         PRIMARY KEY (key_id, token)){tail}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_themselves() {
        assert_eq!(prefix_pattern(Flavor::Postgres, "a%_!b*"), "a!%!_!!b*%");
        assert_eq!(prefix_pattern(Flavor::MySql, ""), "%");
        assert_eq!(prefix_pattern(Flavor::Sqlite, "a%_"), "a%_");
    }

    #[test]
    fn the_sweep_is_bounded_on_every_database() {
        for flavor in [Flavor::Postgres, Flavor::MySql, Flavor::Sqlite] {
            let sql = HolderSql::new(flavor, "lock_keys");
            assert!(sql.prune.contains("LIMIT 100"), "{}", sql.prune);
            assert!(sql.prune.contains("lock_keys_holder"), "{}", sql.prune);
        }
        let my = HolderSql::new(Flavor::MySql, "t").prune;
        assert!(
            my.starts_with("DELETE FROM t_holder WHERE t_holder.key_id"),
            "{my}"
        );
        let pg = HolderSql::new(Flavor::Postgres, "t");
        assert!(pg.upsert.contains("WHEN $5 = 1"), "{}", pg.upsert);
    }
}
