//! A key handed from `acquire` to `release` keeps the DSN's user name (never its password), so
//! the hand-over works for a PostgreSQL role and a Redis ACL user: the key alone on PostgreSQL
//! (the password, where there is one, from `PGPASSWORD` or `~/.pgpass`, as libpq's), the key with
//! the store's DSN (`--store` or `$XTR_LOCK_STORE`) where a password is needed.

use xtr_lock_testkit::postgres::PostgresServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::common::xtr;

/// `xtr-lock` without the caller's store, configuration or PostgreSQL user in its environment.
fn bare() -> assert_cmd::Command {
    let mut cmd = xtr();
    cmd.env_remove("XTR_LOCK_STORE")
        .env_remove("XTR_LOCK_CONFIG")
        .env_remove("PGUSER")
        .env_remove("PGPASSWORD");
    cmd
}

fn acquire(dsn: &str, resource: &str) -> String {
    let out = bare()
        .args(["acquire", "--store", dsn, "--ttl", "10m", resource])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_key_taken_as_a_postgresql_role_is_released_by_the_key_alone() {
    let server = PostgresServer::start();
    server.psql("CREATE ROLE alice LOGIN; GRANT ALL ON SCHEMA public TO alice");
    let dsn = format!("postgres://alice@127.0.0.1:{}/postgres", server.port());
    bare().args(["migrate", "--store", &dsn]).assert().success();
    let key = acquire(&dsn, "handed");
    let json: serde_json::Value = serde_json::from_str(&key).unwrap();
    assert_eq!(
        json["store"],
        serde_json::json!([format!(
            "postgres://alice@127.0.0.1:{}/postgres",
            server.port()
        )])
    );
    assert_eq!(server.psql("SELECT count(*) FROM lock_keys"), "1");
    // The README's hand-over: the key alone (before: connected as the OS user, `role "root"
    // does not exist`, and the lock stayed held for its ttl).
    bare()
        .args(["release", "-"])
        .write_stdin(key.clone())
        .assert()
        .success();
    assert_eq!(server.psql("SELECT count(*) FROM lock_keys"), "0");
    // The same store with the user given again is the same store.
    let key = acquire(&dsn, "again");
    bare()
        .args(["release", "--store", &dsn, "-"])
        .write_stdin(key)
        .assert()
        .success();
    assert_eq!(server.psql("SELECT count(*) FROM lock_keys"), "0");
}

#[test]
fn a_key_taken_as_a_redis_acl_user_names_it_and_takes_the_password_from_the_store() {
    let server = RedisServer::start();
    server.cli(&[
        "ACL",
        "SETUSER",
        "alice",
        "on",
        ">s3cret-pw",
        "~*",
        "&*",
        "+@all",
    ]);
    // Nobody gets in without a password any more (the testkit's redis-cli included).
    server.cli(&["ACL", "SETUSER", "default", "off"]);
    let as_alice = |args: &[&str]| {
        let mut all = vec![
            "--user",
            "alice",
            "--pass",
            "s3cret-pw",
            "--no-auth-warning",
        ];
        all.extend_from_slice(args);
        server.cli(&all)
    };
    let dsn = format!("redis://alice:s3cret-pw@127.0.0.1:{}/0", server.port());
    let key = acquire(&dsn, "handed");
    assert!(!key.contains("s3cret"), "{key}");
    let json: serde_json::Value = serde_json::from_str(&key).unwrap();
    assert_eq!(
        json["store"],
        serde_json::json!([format!("redis://alice@127.0.0.1:{}/0", server.port())])
    );
    // The key alone cannot log in: the error says where the password goes, the lock stays.
    let out = bare()
        .args(["release", "-"])
        .write_stdin(key.clone())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("a key carries no password") && stderr.contains("$XTR_LOCK_STORE"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
    assert_eq!(as_alice(&["EXISTS", "handed"]), "1");
    // With the store's DSN in the environment (or --store): released.
    bare()
        .args(["release", "-"])
        .env("XTR_LOCK_STORE", &dsn)
        .write_stdin(key)
        .assert()
        .success();
    assert_eq!(as_alice(&["EXISTS", "handed"]), "0");
    let key = acquire(&dsn, "again");
    bare()
        .args(["release", "--store", &dsn, "-"])
        .write_stdin(key)
        .assert()
        .success();
    assert_eq!(as_alice(&["EXISTS", "again"]), "0");
}
