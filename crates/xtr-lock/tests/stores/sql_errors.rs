//! What the database stores say when the database is down or refuses: the cause (a refused
//! connection, the server's own message), once, within the caller's wait.

use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, Report, StoreFactory};

use crate::support::symfony_sql::Db;

fn unique(name: &str) -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    format!("sql-errors:{name}:{:08x}", u32::from_le_bytes(b))
}

fn lock_on(dsn: &str, name: &str) -> xtr_lock::Lock {
    LockFactory::from_arc(StoreFactory::create_store(dsn).unwrap()).create_lock(unique(name))
}

/// The wait `-w 3` asks for.
const WAIT: Duration = Duration::from_secs(3);

/// A killed server: a wait ends by its deadline (not the pool's longer connect timeout) with
/// the refused connection as the cause, and a single attempt says so at once, not after the
/// connect timeout as a pool timeout.
async fn a_server_down_is_a_refused_connection_within_the_wait(mut db: Db) {
    // A connect timeout longer than the wait: the pool alone would still be trying.
    let dsn = format!("{}&connect_timeout=10", db.dsn());
    db.kill();
    let lock = lock_on(&dsn, "down");

    let started = Instant::now();
    let err = lock
        .acquire_timeout(WAIT)
        .await
        .expect_err("a database that is down is an error, not a lock held by someone else");
    let took = started.elapsed();
    let said = Report::new(&err).to_string();
    assert!(said.to_lowercase().contains("connection refused"), "{said}");
    assert!(!said.contains("pool timed out"), "{said}");
    assert!(took < WAIT + Duration::from_secs(3), "{took:?}: {said}");

    let started = Instant::now();
    let err = lock.try_acquire().await.unwrap_err();
    let said = Report::new(&err).to_string();
    assert!(said.to_lowercase().contains("connection refused"), "{said}");
    assert!(err.is_temporary(), "{said}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}, not the 10 s connect timeout: {said}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_is_a_refused_connection_within_the_wait() {
    a_server_down_is_a_refused_connection_within_the_wait(Db::postgres()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_down_is_a_refused_connection_within_the_wait() {
    a_server_down_is_a_refused_connection_within_the_wait(Db::mariadb()).await;
}

/// `said` names `cause` exactly once, and no line of the server's own source.
fn said_once(dsn: &str, said: &str, cause: &str) {
    assert_eq!(said.matches(cause).count(), 1, "{dsn}: {said}");
    assert!(!said.contains(" at line "), "{dsn}: {said}");
    assert!(
        !said.contains("error returned from database"),
        "{dsn}: {said}"
    );
    assert!(!said.contains('\n'), "{dsn}: {said}");
}

/// A refusal by the server (an unknown role, an unknown database) is said once, on the table
/// store and on the session stores alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_refusal_is_said_once() {
    let db = Db::postgres();
    let url = db.url().replace("postgres@", "nosuchrole@");
    let advisory = url.replacen("postgres://", "postgres+advisory://", 1);
    for dsn in [url, advisory] {
        let err = lock_on(&dsn, "refused").try_acquire().await.unwrap_err();
        said_once(
            &dsn,
            &Report::new(&err).to_string(),
            "role \"nosuchrole\" does not exist",
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_refusal_is_said_once() {
    let db = Db::mariadb();
    let url = db.url().replace("/xtr", "/nosuchdb");
    let getlock = url.replacen("mysql://", "mysql+getlock://", 1);
    for dsn in [url, getlock] {
        let err = lock_on(&dsn, "refused").try_acquire().await.unwrap_err();
        said_once(
            &dsn,
            &Report::new(&err).to_string(),
            "Unknown database 'nosuchdb'",
        );
    }
}
