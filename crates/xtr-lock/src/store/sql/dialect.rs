//! Every SQL text of the table store, per database. Tables are spliced in (checked identifiers);
//! everything else is bound.
//!
//! The clock is the database's, read once per statement and quantised as Symfony does, so both
//! sides agree on when a row expires: PostgreSQL rounds `statement_timestamp()` (never `now()`,
//! the start of the transaction), MySQL's `UNIX_TIMESTAMP()` and SQLite's `'now'` truncate.

/// Which database a text is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    Postgres,
    MySql,
    Sqlite,
}

/// The statements of one table on one database.
#[derive(Debug)]
pub(crate) struct Sql {
    /// Acquire. PostgreSQL: one statement that also draws the fencing token and reads the
    /// holder it met; MySQL: the upsert alone (the outcome comes back in `LAST_INSERT_ID`);
    /// SQLite: the conditional upsert, run in a write transaction after `read`.
    pub(crate) save: String,
    /// Draws the next fencing token of a resource (PostgreSQL draws in `save` too).
    pub(crate) draw: String,
    /// The row of a resource: its token, whether it is live, its remaining milliseconds.
    pub(crate) read: String,
    /// Extends our own live row; never inserts, never revives an expired row.
    pub(crate) refresh: String,
    /// Deletes our own row. PostgreSQL and SQLite answer whether it was live (PostgreSQL also
    /// notifies the waiters); MySQL deletes only a live row (`delete_any` removes an expired one).
    pub(crate) delete: String,
    /// MySQL: deletes our own row, live or not.
    pub(crate) delete_any: String,
    /// The live holder of a resource and its remaining milliseconds.
    pub(crate) holders: String,
    /// A resource's fencing counter.
    pub(crate) fence: String,
    /// Up to 100 rows expired for more than a second (past the quantisation).
    pub(crate) prune: String,
    /// Up to 100 fencing counters of resources without a row, below the clock in microseconds
    /// (the seed of a new counter, so a counter swept and made again keeps increasing).
    pub(crate) prune_fence: String,
    /// The DDL: the lock table (Symfony's types), then the fencing table.
    pub(crate) create: [String; 2],
    /// The columns of a table: name, type, length (bind the table's name).
    pub(crate) columns: String,
}

impl Sql {
    pub(crate) fn new(flavor: Flavor, table: &str) -> Sql {
        let t = table;
        let f = format!("{table}_fence");
        let h = holder_table(table);
        match flavor {
            Flavor::Postgres => postgres(t, &f, &h),
            Flavor::MySql => mysql(t, &f, &h),
            Flavor::Sqlite => sqlite(t, &f, &h),
        }
    }
}

/// The joins that bring a lock row's holder record and fencing counter (aliases `x`, `g`).
fn with_record(h: &str, f: &str) -> String {
    format!(
        "LEFT JOIN {h} x ON x.key_id = l.key_id AND x.token = l.key_token \
         LEFT JOIN {f} g ON g.key_id = l.key_id"
    )
}

const PG_NOW: &str = "CAST(EXTRACT(epoch FROM statement_timestamp()) AS INT)";
/// The statement's clock in microseconds: the seed of a new fencing counter.
const PG_MICROS: &str = "CAST(EXTRACT(epoch FROM statement_timestamp()) * 1000000 AS BIGINT)";
/// The statement's clock in milliseconds: a holder's acquisition time.
const PG_MILLIS: &str = "CAST(EXTRACT(epoch FROM statement_timestamp()) * 1000 AS BIGINT)";

/// The queue's part of PostgreSQL's fair save (built in `queue_sql`): `blocked` is the
/// `FROM … WHERE …` of the live tickets queued before the caller, `ctes` the statements that
/// queue or take out the caller's ticket (after `up`).
pub(crate) struct PgQueue {
    pub(crate) blocked: String,
    pub(crate) ctes: String,
}

/// PostgreSQL's save: the lock row, the fencing draw and the holder's record in one statement.
/// `old` is the row as the statement found it. A holder's statements run one after the
/// other, so our token in `old` means the row was ours: then only our own row is
/// updated (a re-save, no new fencing token), never a row someone took over meanwhile.
/// Otherwise the upsert is an insert or the takeover of an expired row, and draws.
/// Rows become takeable half a second early (the clock rounds), hence the `- 0.5`.
///
/// With `queue` (a fair store), the takeover of a free or expired row happens only when no
/// live ticket stands before the caller (`w`), or when the row is already the caller's (a
/// re-save is never kept out); the fifth column says the queue refused it. One builder for
/// both, so the fair statement cannot drift from the unfair one.
pub(crate) fn postgres_save(t: &str, f: &str, h: &str, queue: Option<&PgQueue>) -> String {
    let now = PG_NOW;
    let (w, from, gate, ctes, refused) = match queue {
        Some(q) => (
            format!("w AS (SELECT EXISTS (SELECT 1 {}) AS b), ", q.blocked),
            "c, w",
            " WHERE NOT w.b OR EXISTS (SELECT 1 FROM old WHERE old.key_token = $2)",
            format!(", {}", q.ctes),
            "(SELECT b FROM w)",
        ),
        None => (String::new(), "c", "", String::new(), "false"),
    };
    format!(
        "WITH c AS (SELECT {now} AS s, EXTRACT(epoch FROM statement_timestamp()) AS f), \
         old AS (SELECT key_token, key_expiration FROM {t} WHERE key_id = $1), \
         {w}\
         up AS (INSERT INTO {t} AS l (key_id, key_token, key_expiration) \
                SELECT $1, $2, c.s + $3 FROM {from}{gate} \
                ON CONFLICT (key_id) DO UPDATE \
                SET key_token = EXCLUDED.key_token, key_expiration = EXCLUDED.key_expiration \
                WHERE l.key_token = EXCLUDED.key_token \
                   OR (l.key_expiration <= (SELECT s FROM c) \
                       AND NOT EXISTS (SELECT 1 FROM old WHERE old.key_token = $2)) \
                RETURNING 1), \
         d AS (INSERT INTO {f} AS g (key_id, n) SELECT $1, {PG_MICROS} FROM up \
               WHERE NOT EXISTS (SELECT 1 FROM old WHERE old.key_token = $2) \
               ON CONFLICT (key_id) DO UPDATE SET n = g.n + 1 RETURNING g.n), \
         r AS (INSERT INTO {h} AS x (key_id, token, resource, record, at_ms) \
               SELECT $1, $2, $4, $5, {PG_MILLIS} FROM up \
               ON CONFLICT (key_id, token) DO UPDATE SET resource = EXCLUDED.resource, \
               record = EXCLUDED.record, at_ms = CASE WHEN EXISTS \
               (SELECT 1 FROM old WHERE old.key_token = $2) THEN x.at_ms \
               ELSE EXCLUDED.at_ms END){ctes} \
         SELECT EXISTS (SELECT 1 FROM up), (SELECT n FROM d), \
                (SELECT key_token FROM old), \
                (SELECT CAST((old.key_expiration - 0.5 - c.f) * 1000 AS BIGINT) FROM old, c), \
                {refused}"
    )
}

fn postgres(t: &str, f: &str, h: &str) -> Sql {
    let now = PG_NOW;
    Sql {
        save: postgres_save(t, f, h, None),
        draw: format!(
            "INSERT INTO {f} AS g (key_id, n) VALUES ($1, {PG_MICROS}) \
             ON CONFLICT (key_id) DO UPDATE SET n = g.n + 1 RETURNING g.n"
        ),
        read: format!(
            "SELECT key_token, COALESCE(key_expiration > {now}, false), \
             CAST((key_expiration - 0.5 - EXTRACT(epoch FROM statement_timestamp())) * 1000 \
             AS BIGINT) FROM {t} WHERE key_id = $1"
        ),
        refresh: format!(
            "UPDATE {t} SET key_expiration = {now} + $3 \
             WHERE key_id = $1 AND key_token = $2 AND key_expiration > {now}"
        ),
        // The notification goes out at commit, and only when a row was deleted. The holder's
        // record goes in the same statement.
        delete: format!(
            "WITH d AS (DELETE FROM {t} WHERE key_id = $1 AND key_token = $2 \
                        RETURNING key_id, key_expiration), \
             r AS (DELETE FROM {h} WHERE key_id = $1 AND token = $2) \
             SELECT COALESCE(d.key_expiration > {now}, false), pg_notify($3, d.key_id) FROM d"
        ),
        delete_any: String::new(),
        holders: format!(
            "SELECT l.key_token, \
             CAST((l.key_expiration - 0.5 - EXTRACT(epoch FROM statement_timestamp())) * 1000 \
             AS BIGINT), x.record, x.at_ms, g.n FROM {t} l {} \
             WHERE l.key_id = $1 AND l.key_expiration > {now}",
            with_record(h, f)
        ),
        fence: format!("SELECT n FROM {f} WHERE key_id = $1"),
        // The outer condition is checked again on a row changed meanwhile (taken over).
        prune: format!(
            "DELETE FROM {t} WHERE key_id IN \
             (SELECT key_id FROM {t} WHERE key_expiration < {now} - 1 LIMIT 100) \
             AND key_expiration < {now} - 1"
        ),
        prune_fence: format!(
            "DELETE FROM {f} WHERE key_id IN (SELECT g.key_id FROM {f} g \
             WHERE NOT EXISTS (SELECT 1 FROM {t} l WHERE l.key_id = g.key_id) \
             AND g.n < {PG_MICROS} LIMIT 100)"
        ),
        create: [
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (key_id VARCHAR(64) NOT NULL PRIMARY KEY, \
                 key_token VARCHAR(64) NOT NULL, key_expiration INTEGER)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {f} (key_id VARCHAR(64) NOT NULL PRIMARY KEY, \
                 n BIGINT NOT NULL)"
            ),
        ],
        columns: "SELECT CAST(column_name AS TEXT), CAST(data_type AS TEXT), \
                  CAST(character_maximum_length AS BIGINT) FROM information_schema.columns \
                  WHERE table_schema = current_schema() AND table_name = $1"
            .to_owned(),
    }
}

const MY_NOW: &str = "UNIX_TIMESTAMP()";
const MY_MICROS: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)";

fn mysql(t: &str, f: &str, h: &str) -> Sql {
    let now = MY_NOW;
    Sql {
        // MySQL has no conditional ON CONFLICT: one IF() per column, the token first. The
        // assignments run left to right and each sees the earlier ones, so the second IF sees
        // our token exactly when the row is ours now (already, or after the takeover). The
        // other order would extend another holder's row.
        //
        // The outcome comes back in LAST_INSERT_ID, set in the VALUES (0: inserted) and, on a
        // duplicate, from the row as it was (1: ours, 2: expired and taken over, 3: someone
        // else's): unlike the affected-row count, it does not depend on CLIENT_FOUND_ROWS, and
        // our own re-save within the same second (identical values) is not mistaken for a
        // refusal.
        save: format!(
            "INSERT INTO {t} (key_id, key_token, key_expiration) \
             VALUES (?, ?, {now} + ? + LAST_INSERT_ID(0)) \
             ON DUPLICATE KEY UPDATE \
             key_token = IF(LAST_INSERT_ID(CASE WHEN key_token = VALUES(key_token) THEN 1 \
                                                WHEN key_expiration <= {now} THEN 2 \
                                                ELSE 3 END) < 3, \
                            VALUES(key_token), key_token), \
             key_expiration = IF(key_token = VALUES(key_token), VALUES(key_expiration), \
                                 key_expiration)"
        ),
        draw: format!(
            "INSERT INTO {f} (key_id, n) VALUES (?, LAST_INSERT_ID({MY_MICROS})) \
             ON DUPLICATE KEY UPDATE n = LAST_INSERT_ID(n + 1)"
        ),
        read: format!(
            "SELECT key_token, CAST(key_expiration > {now} AS SIGNED), \
             CAST((key_expiration - UNIX_TIMESTAMP(NOW(6))) * 1000 AS SIGNED) \
             FROM {t} WHERE key_id = ?"
        ),
        refresh: format!(
            "UPDATE {t} SET key_expiration = {now} + ? \
             WHERE key_id = ? AND key_token = ? AND key_expiration > {now}"
        ),
        // The holder's record goes in the same statement (the count is of both tables' rows).
        delete: format!(
            "DELETE l, x FROM {t} l LEFT JOIN {h} x ON x.key_id = l.key_id \
             AND x.token = l.key_token \
             WHERE l.key_id = ? AND l.key_token = ? AND l.key_expiration > {now}"
        ),
        delete_any: format!(
            "DELETE l, x FROM {t} l LEFT JOIN {h} x ON x.key_id = l.key_id \
             AND x.token = l.key_token WHERE l.key_id = ? AND l.key_token = ?"
        ),
        holders: format!(
            "SELECT l.key_token, \
             CAST((l.key_expiration - UNIX_TIMESTAMP(NOW(6))) * 1000 AS SIGNED), \
             x.record, x.at_ms, CAST(g.n AS SIGNED) FROM {t} l {} \
             WHERE l.key_id = ? AND l.key_expiration > {now}",
            with_record(h, f)
        ),
        fence: format!("SELECT CAST(n AS SIGNED) FROM {f} WHERE key_id = ?"),
        prune: format!("DELETE FROM {t} WHERE key_expiration < {now} - 1 LIMIT 100"),
        prune_fence: format!(
            "DELETE FROM {f} WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE {t}.key_id = {f}.key_id) \
             AND n < {MY_MICROS} LIMIT 100"
        ),
        create: [
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (key_id VARCHAR(64) NOT NULL PRIMARY KEY, \
                 key_token VARCHAR(44) NOT NULL, key_expiration INTEGER UNSIGNED NOT NULL) \
                 COLLATE utf8mb4_bin, ENGINE = InnoDB"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {f} (key_id VARCHAR(64) NOT NULL PRIMARY KEY, \
                 n BIGINT UNSIGNED NOT NULL) COLLATE utf8mb4_bin, ENGINE = InnoDB"
            ),
        ],
        columns: "SELECT CAST(COLUMN_NAME AS CHAR), CAST(DATA_TYPE AS CHAR), \
                  CAST(CHARACTER_MAXIMUM_LENGTH AS SIGNED) FROM information_schema.columns \
                  WHERE table_schema = DATABASE() AND table_name = ?"
            .to_owned(),
    }
}

const LITE_NOW: &str = "CAST(strftime('%s','now') AS INTEGER)";
const LITE_SECONDS: &str = "((julianday('now') - 2440587.5) * 86400.0)";

fn sqlite(t: &str, f: &str, h: &str) -> Sql {
    let now = LITE_NOW;
    Sql {
        save: format!(
            "INSERT INTO {t} (key_id, key_token, key_expiration) VALUES (?1, ?2, {now} + ?3) \
             ON CONFLICT (key_id) DO UPDATE \
             SET key_token = excluded.key_token, key_expiration = excluded.key_expiration \
             WHERE {t}.key_token = excluded.key_token OR {t}.key_expiration <= {now} \
             RETURNING 1"
        ),
        draw: format!(
            "INSERT INTO {f} (key_id, n) VALUES (?1, CAST({LITE_SECONDS} * 1000000 AS INTEGER)) \
             ON CONFLICT (key_id) DO UPDATE SET n = n + 1 RETURNING n"
        ),
        read: format!(
            "SELECT key_token, COALESCE(key_expiration > {now}, 0), \
             CAST((key_expiration - {LITE_SECONDS}) * 1000 AS INTEGER) \
             FROM {t} WHERE key_id = ?1"
        ),
        refresh: format!(
            "UPDATE {t} SET key_expiration = {now} + ?3 \
             WHERE key_id = ?1 AND key_token = ?2 AND key_expiration > {now}"
        ),
        delete: format!(
            "DELETE FROM {t} WHERE key_id = ?1 AND key_token = ?2 \
             RETURNING COALESCE(key_expiration > {now}, 0)"
        ),
        delete_any: String::new(),
        holders: format!(
            "SELECT l.key_token, CAST((l.key_expiration - {LITE_SECONDS}) * 1000 AS INTEGER), \
             x.record, x.at_ms, g.n FROM {t} l {} \
             WHERE l.key_id = ?1 AND l.key_expiration > {now}",
            with_record(h, f)
        ),
        fence: format!("SELECT n FROM {f} WHERE key_id = ?1"),
        prune: format!(
            "DELETE FROM {t} WHERE key_id IN \
             (SELECT key_id FROM {t} WHERE key_expiration < {now} - 1 LIMIT 100) \
             AND key_expiration < {now} - 1"
        ),
        prune_fence: format!(
            "DELETE FROM {f} WHERE key_id IN (SELECT g.key_id FROM {f} g \
             WHERE NOT EXISTS (SELECT 1 FROM {t} l WHERE l.key_id = g.key_id) \
             AND g.n < CAST({LITE_SECONDS} * 1000000 AS INTEGER) LIMIT 100)"
        ),
        create: [
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (key_id TEXT NOT NULL PRIMARY KEY, \
                 key_token TEXT NOT NULL, key_expiration INTEGER)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {f} (key_id TEXT NOT NULL PRIMARY KEY, \
                 n INTEGER NOT NULL)"
            ),
        ],
        columns: "SELECT name, type, NULL FROM pragma_table_info(?1)".to_owned(),
    }
}

/// The records' table, beside `table`.
pub(crate) fn holder_table(table: &str) -> String {
    format!("{table}_holder")
}

/// PostgreSQL's parameters are numbered: `?` becomes `$1`, `$2`, … in `text` (a `$n` written
/// as such is left as it is).
pub(crate) fn numbered(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut i = 0;
    for c in text.chars() {
        if c == '?' {
            i += 1;
            out.push_str(&format!("${i}"));
        } else {
            out.push(c);
        }
    }
    out
}
