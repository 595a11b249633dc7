//! The factory's tests: keywords, refusals that show the scheme only, schemes by row.

use super::*;
use crate::ErrorKind;

#[test]
fn keywords_build_their_stores() {
    let a = StoreFactory::create_store("in-memory").unwrap();
    assert_eq!(a.to_string(), "in-memory");
    assert_eq!(
        StoreFactory::create_store("null").unwrap().to_string(),
        "null"
    );
}

#[test]
fn refusals_name_the_scheme_only() {
    let memcached_kind = if cfg!(feature = "memcached") {
        ErrorKind::InvalidArgument
    } else {
        ErrorKind::Unsupported
    };
    let cases: &[(&str, ErrorKind, &str)] = &[
        // With the store built, a credential is refused (no SASL); without it, the store
        // is missing. Either way the scheme is all that is shown.
        (
            "memcached://user:secret@db:11211",
            memcached_kind,
            "\"memcached:\"",
        ),
        (
            "MEMCACHED://user:secret@db:11211",
            memcached_kind,
            "MEMCACHED:\"",
        ),
        ("FLOCK", ErrorKind::InvalidArgument, "\"FLOCK\""),
        ("IN-MEMORY", ErrorKind::InvalidArgument, "\"IN-MEMORY\""),
        ("SEMAPHORE", ErrorKind::InvalidArgument, "\"SEMAPHORE\""),
        (
            "my_redis_service",
            ErrorKind::InvalidArgument,
            "\"my_redis_service\"",
        ),
        ("memcache://h", ErrorKind::InvalidArgument, "\"memcache:\""),
        ("", ErrorKind::InvalidArgument, "redacted"),
        (
            "hunter2 pasted secret",
            ErrorKind::InvalidArgument,
            "redacted",
        ),
        ("user:pa ss@host", ErrorKind::InvalidArgument, "\"user:\""),
        ("p@ss:word", ErrorKind::InvalidArgument, "redacted"),
    ];
    for (dsn, kind, shown) in cases {
        let err = StoreFactory::create_store(dsn).unwrap_err();
        let msg = err.to_string();
        assert_eq!(err.kind(), *kind, "{dsn}: {msg}");
        assert!(msg.contains(shown), "{dsn}: {msg}");
        for secret in ["secret", "pw@", "hunter2", "pa ss", "word"] {
            assert!(!msg.contains(secret), "{dsn}: {msg}");
        }
        // validate refuses exactly what create_store refuses.
        assert_eq!(StoreFactory::validate(dsn).unwrap_err().kind(), *kind);
    }
    assert!(StoreFactory::validate("in-memory").is_ok());
    assert!(StoreFactory::validate("null").is_ok());
}

#[test]
fn a_path_is_not_a_store() {
    let err = StoreFactory::validate("/var/lock").unwrap_err();
    assert!(
        err.to_string()
            .contains("a path is not a store; flock:///var/lock was probably meant"),
        "{err}"
    );
}

#[test]
fn every_scheme_names_one_row() {
    let mut seen = std::collections::BTreeSet::new();
    for row in schemes::table() {
        let schemes = row.kind.schemes.iter().map(|s| (s, "scheme"));
        for (name, what) in schemes.chain(row.kind.keywords.iter().map(|k| (k, "keyword"))) {
            assert!(seen.insert((*name, what)), "{what} {name} is in two rows");
            assert_eq!(*name, name.to_ascii_lowercase(), "{name}");
        }
        assert!(row.build.is_some() == row.kind.built && row.check.is_some() == row.kind.built);
    }
    assert_eq!(StoreFactory::kind("REDIS://h").unwrap().name, "redis");
    assert_eq!(
        StoreFactory::kind("redis+pubsub://h").unwrap().name,
        "pubsub"
    );
    assert_eq!(
        StoreFactory::kind("sqlite::memory:").unwrap().fencing,
        Fencing::PerResource
    );
    assert!(StoreFactory::kind("sqlite::memory:").unwrap().tables);
    assert!(
        StoreFactory::kind("FLOCK").is_none(),
        "keywords are case-sensitive"
    );
}

/// What help texts show of a kind is true of it: its example names it (and, built, is a valid
/// DSN), its summary fits on a line.
#[test]
fn every_kind_has_an_example_that_names_it_and_a_one_line_summary() {
    let kinds: Vec<_> = StoreFactory::kinds().collect();
    assert_eq!(kinds.len(), schemes::table().len());
    assert_eq!(kinds[0].name, "flock", "the default comes first");
    for kind in kinds {
        assert_eq!(
            StoreFactory::kind(kind.example).map(|k| k.name),
            Some(kind.name)
        );
        if kind.built {
            StoreFactory::validate(kind.example).unwrap();
        }
        assert!(
            !kind.summary.is_empty() && kind.summary.len() <= 60,
            "{}: {:?}",
            kind.name,
            kind.summary
        );
    }
}

#[cfg(feature = "redis")]
#[test]
fn redis_dsns_build_redis_stores_without_touching_the_network() {
    let store = StoreFactory::create_store("redis://:pw@localhost:1/0?prefix=app:").unwrap();
    assert_eq!(store.to_string(), "redis://localhost:1/0");
    assert!(store.capabilities().expiring);
    let err = StoreFactory::validate("redis://:pw@localhost:notaport").unwrap_err();
    assert!(!err.to_string().contains("pw"), "{err}");
}

#[test]
fn in_memory_gives_a_new_store_each_time() {
    let a = StoreFactory::create_store("in-memory").unwrap();
    let b = StoreFactory::create_store("in-memory").unwrap();
    assert!(!Arc::ptr_eq(&a, &b));
}

#[test]
fn dsns_are_shown_without_credentials() {
    let shown = crate::StoreFactory::redact;
    assert_eq!(shown("flock"), "flock");
    assert_eq!(
        shown("redis://:hunter2@cache:6379/0"),
        "redis://:***@cache:6379/0"
    );
    assert_eq!(shown("redis://hunter2@cache/0"), "redis://***@cache/0");
    assert_eq!(
        shown("postgresql+advisory://app:hunter2@db/app?keys=crc32"),
        "postgresql+advisory://app:***@db/app?keys=crc32"
    );
    assert_eq!(
        shown("mysql://app@db/app?password=hunter2&ssl-mode=required&ssl-key=k"),
        "mysql://app@db/app?password=***&ssl-mode=required&ssl-key=***"
    );
    assert_eq!(shown("redis://[bad"), "redis:(redacted: not a URL)");
    assert_eq!(shown("p@ss://[bad"), "(redacted):(redacted: not a URL)");
    assert_eq!(shown("flock:///var/lock"), "flock:///var/lock");
}

#[test]
fn a_mistyped_scheme_gets_the_one_it_meant() {
    for (dsn, meant) in [
        ("redsi://h", "redis:"),
        ("memcache://u:pw@h", "memcached:"),
        ("Postgress://u:pw@h/db", "postgres:"),
        ("etdc://h", "etcd:"),
    ] {
        let err = StoreFactory::validate(dsn).unwrap_err().to_string();
        assert!(
            err.ends_with(&format!("did you mean \"{meant}\"?")),
            "{dsn}: {err}"
        );
        assert!(!err.contains("pw"), "{err}");
    }
    let err = StoreFactory::validate("nosuch://h")
        .unwrap_err()
        .to_string();
    assert_eq!(err, "unsupported connection \"nosuch:\"");
}

/// The table's `counting` (what help texts list for `--limit`) and `lists` (for `list`) are what
/// the stores say.
#[tokio::test]
async fn every_kind_says_whether_it_counts_as_its_stores_do() {
    for kind in StoreFactory::kinds().filter(|k| k.built) {
        let store = StoreFactory::create_store(kind.example).unwrap();
        assert_eq!(
            kind.counting,
            store.capabilities().counting,
            "{}: the table and the store disagree on semaphores",
            kind.name
        );
        assert_eq!(
            kind.lists,
            store.capabilities().lists,
            "{}: the table and the store disagree on listing",
            kind.name
        );
    }
}
