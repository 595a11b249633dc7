//! Symfony's table store as a peer: throwaway PostgreSQL and MariaDB servers, and the PHP holder
//! (`tests/peers/symfony_holder.php`) run as a child whose event lines the tests read.

use std::collections::HashMap;
use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::postgres::PostgresServer;

/// A database server of one kind.
pub(crate) enum Db {
    Postgres(PostgresServer),
    MariaDb(MariaDbServer),
}

impl Db {
    pub(crate) fn postgres() -> Db {
        Db::Postgres(PostgresServer::start())
    }

    pub(crate) fn mariadb() -> Db {
        Db::MariaDb(MariaDbServer::start())
    }

    /// The Rust store's DSN (tables made on first use).
    pub(crate) fn dsn(&self) -> String {
        let url = match self {
            Db::Postgres(s) => s.url(),
            Db::MariaDb(s) => s.url(),
        };
        format!("{url}?create_table=true")
    }

    pub(crate) fn store(&self) -> xtr_lock::SqlStore {
        xtr_lock::SqlStore::from_dsn(&self.dsn()).unwrap()
    }

    /// The PDO DSN and user of Symfony's `PdoStore` on the same database.
    fn pdo(&self) -> (String, &'static str) {
        match self {
            Db::Postgres(s) => (
                format!(
                    "pgsql:host=127.0.0.1;port={};dbname=postgres;sslmode=disable",
                    s.port()
                ),
                "postgres",
            ),
            Db::MariaDb(s) => (
                format!("mysql:host=127.0.0.1;port={};dbname=xtr", s.port()),
                "root",
            ),
        }
    }

    /// Runs `sql` with the server's own client; its output, trimmed (tables unqualified: the
    /// MariaDB client is pointed at the test database).
    pub(crate) fn query(&self, sql: &str) -> String {
        match self {
            Db::Postgres(s) => s.psql(sql),
            Db::MariaDb(s) => s.sql(&format!("USE xtr; {sql}")),
        }
    }

    /// The `key_token` of `resource`'s row, if there is one.
    pub(crate) fn token_of(&self, resource: &str) -> Option<String> {
        let id = xtr_lock::store::sql_key_id(resource);
        let out = self.query(&format!(
            "SELECT key_token FROM lock_keys WHERE key_id = '{id}'"
        ));
        (!out.is_empty()).then_some(out)
    }

    pub(crate) fn kill(&mut self) {
        match self {
            Db::Postgres(s) => s.kill(),
            Db::MariaDb(s) => s.kill(),
        }
    }

    pub(crate) fn restart(&mut self) {
        match self {
            Db::Postgres(s) => s.restart(),
            Db::MariaDb(s) => s.restart(),
        }
    }

    /// SIGSTOP: connections stay open, nothing answers.
    pub(crate) fn pause(&self) {
        match self {
            Db::Postgres(s) => s.pause(),
            Db::MariaDb(s) => s.pause(),
        }
    }

    pub(crate) fn resume(&self) {
        match self {
            Db::Postgres(s) => s.resume(),
            Db::MariaDb(s) => s.resume(),
        }
    }

    /// The server's URL, without options.
    pub(crate) fn url(&self) -> String {
        match self {
            Db::Postgres(s) => s.url(),
            Db::MariaDb(s) => s.url(),
        }
    }

    pub(crate) fn port(&self) -> u16 {
        match self {
            Db::Postgres(s) => s.port(),
            Db::MariaDb(s) => s.port(),
        }
    }
}

/// One event line of the holder.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) event: String,
    /// Seconds since the epoch, when the holder printed it.
    pub(crate) at: f64,
    pub(crate) fields: HashMap<String, String>,
}

impl Event {
    fn parse(line: &str) -> Option<Event> {
        let mut head = line.splitn(5, ' ');
        let _iso = head.next()?;
        let at = head.next()?.parse().ok()?;
        let _pid = head.next()?;
        let event = head.next()?.to_owned();
        let mut rest = head.next().unwrap_or("");
        let mut fields = HashMap::new();
        // `k=v` pairs; a value that starts with a quote is JSON and may hold spaces.
        while let Some((k, tail)) = rest.split_once('=') {
            let (value, next) = if tail.starts_with('"') {
                let mut end = 1;
                let bytes = tail.as_bytes();
                while end < bytes.len() && bytes[end] != b'"' {
                    end += if bytes[end] == b'\\' { 2 } else { 1 };
                }
                let raw = &tail[..(end + 1).min(tail.len())];
                let v = serde_json::from_str(raw).unwrap_or_else(|_| raw.to_owned());
                (v, tail.get(end + 2..).unwrap_or(""))
            } else {
                let (v, next) = tail.split_once(' ').unwrap_or((tail, ""));
                (v.to_owned(), next)
            };
            fields.insert(k.trim().to_owned(), value);
            rest = next;
        }
        Some(Event { event, at, fields })
    }

    pub(crate) fn get(&self, k: &str) -> &str {
        self.fields.get(k).map(String::as_str).unwrap_or("")
    }
}

/// A running PHP holder.
pub(crate) struct Holder {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    pub(crate) seen: Vec<Event>,
}

const TERMINAL: &[&str] = &["BUSY", "TIMEOUT", "LOST", "ERROR", "RELEASED"];

impl Holder {
    /// `php symfony_holder.php <pdo dsn> <resource> write <seconds> <args…> --user=…`.
    pub(crate) fn start(db: &Db, resource: &str, seconds: f64, args: &[&str]) -> Holder {
        let (dsn, user) = db.pdo();
        let user = format!("--user={user}");
        let mut all = args.to_vec();
        all.push(&user);
        Self::start_on(&dsn, resource, "write", seconds, &all)
    }

    /// `php symfony_holder.php <store> <resource> <mode> <seconds> <args…>`: any store the script
    /// knows (`pgsql+advisory:…` for Symfony's `PostgreSqlStore`).
    pub(crate) fn start_on(
        store: &str,
        resource: &str,
        mode: &str,
        seconds: f64,
        args: &[&str],
    ) -> Holder {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/peers/symfony_holder.php"
        );
        let mut child = Command::new("php")
            .arg(script)
            .arg(store)
            .arg(resource)
            .arg(mode)
            .arg(seconds.to_string())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("php (the README's test command installs php-cli php-symfony-lock php-pgsql php-mysql)");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("php holder: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Holder {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (generously) for `event`; panics if the holder ends first or prints another
    /// terminal event.
    pub(crate) async fn until(&mut self, event: &str) -> Event {
        if let Some(e) = self.seen.iter().find(|e| e.event == event) {
            return e.clone();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            match self.lines.try_recv() {
                Ok(line) => {
                    let Some(e) = Event::parse(&line) else {
                        continue;
                    };
                    self.seen.push(e.clone());
                    if e.event == event {
                        return e;
                    }
                    assert!(
                        !TERMINAL.contains(&e.event.as_str()),
                        "the PHP holder printed {} while {event} was expected: {e:?}",
                        e.event
                    );
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the PHP holder did not print {event} within 60 s"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    panic!(
                        "the PHP holder ended without printing {event}: {:?}",
                        self.seen
                    )
                }
            }
        }
    }

    /// Waits until `event` has been printed `n` times (other terminal events are fine here).
    pub(crate) async fn until_count(&mut self, event: &str, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while self.seen.iter().filter(|e| e.event == event).count() < n {
            match self.lines.try_recv() {
                Ok(line) => self.seen.extend(Event::parse(&line)),
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the PHP holder did not print {event} {n} times within 120 s"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    panic!("the PHP holder ended before {n} {event}: {:?}", self.seen)
                }
            }
        }
    }

    /// SIGTERM: the holder releases and prints RELEASED.
    pub(crate) fn term(&self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }

    /// Waits for the holder to exit; its exit code.
    pub(crate) async fn exit_code(mut self) -> i32 {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test per database (PostgreSQL and MariaDB) for each scenario named: `mod postgres` and
/// `mod mariadb`, each calling `super::<name>(Db::…)`.
#[allow(unused_macros)]
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(Db::postgres()).await;
                }
            )*
        }
        mod mariadb {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(Db::mariadb()).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both;
