//! The lock configuration: read from TOML (alone or inside an application's own config), and
//! checked with every problem reported at once, each naming its entry, never a credential.

use std::time::Duration;

use serde::Deserialize;
use xtr_lock::Wait;
use xtr_lock::config::{LocksConfig, QuorumKind};

fn env(name: &str) -> Option<String> {
    match name {
        "REDIS_PASSWORD" => Some("s3cret".into()),
        "PGPASSWORD" => Some("s3cret".into()),
        _ => None,
    }
}

fn problems(toml: &str) -> Vec<String> {
    let config = LocksConfig::from_toml_str(toml).unwrap();
    let errors = config.check_with(&env).expect_err("a problem");
    for p in &errors.problems {
        assert!(!p.contains("s3cret"), "a credential in {p:?}");
        assert!(!p.contains('\n'), "one line each: {p:?}");
    }
    assert!(
        !xtr_lock::Error::from(errors.clone())
            .to_string()
            .contains("s3cret")
    );
    errors.problems
}

#[test]
fn no_configuration_is_one_flock_entry() {
    let checked = LocksConfig::default().check_with(&env).unwrap();
    assert_eq!(checked.default, "default");
    let entry = &checked.entries["default"];
    assert_eq!(entry.store.dsns(), ["flock"]);
    assert_eq!(entry.store.quorum(), None);
    assert_eq!(entry.prefix, "");
    assert_eq!(entry.ttl, Some(xtr_lock::DEFAULT_TTL));
    assert_eq!(entry.wait, Wait::Forever);
    let empty = LocksConfig::from_toml_str("").unwrap();
    assert_eq!(empty, LocksConfig::default());
}

#[test]
fn a_full_configuration_checks_with_variables_overrides_and_quorums() {
    let config = LocksConfig::from_toml_str(
        r#"
prefix = "billing:"
ttl = "5 minutes"
wait = 30
default = "redis"

[stores]
redis = "redis://:${REDIS_PASSWORD}@cache:6379/0"
files = "flock:///var/lock/billing"
quorum = ["redis://r1", "redis://r2", "redis://r3"]
strict = { dsns = ["redis://r1", "redis://r2"], strategy = "unanimous", wait = "0" }
db = { dsn = "postgresql+advisory://app:${PGPASSWORD}@db/app", ttl = "none", prefix = "", wait = "forever" }
local = { dsn = "${LOCK_DSN:-in-memory}", ttl = "1h30m", wait = "250ms" }
"#,
    )
    .unwrap();
    let checked = config.check_with(&env).unwrap();
    assert_eq!(checked.default, "redis");
    let redis = &checked.entries["redis"];
    assert_eq!(redis.store.dsns(), ["redis://:s3cret@cache:6379/0"]);
    assert_eq!(redis.prefix, "billing:");
    assert_eq!(redis.ttl, Some(Duration::from_secs(300)));
    assert_eq!(redis.wait, Wait::AtMost(Duration::from_secs(30)));
    assert_eq!(
        checked.entries["quorum"].store.quorum(),
        Some(QuorumKind::Consensus)
    );
    assert_eq!(checked.entries["quorum"].store.dsns().len(), 3);
    let strict = &checked.entries["strict"];
    assert_eq!(strict.store.quorum(), Some(QuorumKind::Unanimous));
    assert_eq!(strict.wait, Wait::Never);
    let db = &checked.entries["db"];
    assert_eq!(
        (db.ttl, db.prefix.as_str(), db.wait),
        (None, "", Wait::Forever)
    );
    let local = &checked.entries["local"];
    assert_eq!(local.store.dsns(), ["in-memory"]);
    assert_eq!(local.ttl, Some(Duration::from_secs(5400)));
    assert_eq!(local.wait, Wait::AtMost(Duration::from_millis(250)));
    // Debug output shows schemes, not DSNs.
    let shown = format!("{checked:?}");
    assert!(
        !shown.contains("s3cret") && shown.contains("\"redis\""),
        "{shown}"
    );
}

/// One problem per configuration, and the start of the line that reports it.
const ONE_PROBLEM_EACH: &[(&str, &str)] = &[
    (
        r#"stores.redis = "redis://:${UNSET_PASSWORD}@h""#,
        "stores.redis: ${UNSET_PASSWORD} is not set",
    ),
    (
        r#"stores.x = "redis://:s3cret@h:6379/0?frobnicate=1""#,
        "stores.x: ",
    ),
    (
        r#"stores.x = "memcached://u:s3cret@h:11211""#,
        "stores.x: invalid Memcached connection string \"memcached:\": credentials are not supported",
    ),
    (
        r#"stores.x = "nosuch://u:s3cret@h""#,
        "stores.x: unsupported connection \"nosuch:\"",
    ),
    (
        r#"stores.x = "flock://relative/dir""#,
        "stores.x: flock://\"relative/dir\" names a relative directory",
    ),
    (
        r#"stores.x = "redis://${A""#,
        "stores.x: a ${ without its closing }",
    ),
    (
        r#"stores.x = "redis://${1A}""#,
        "stores.x: ${1A} is not a variable name",
    ),
    (
        r#"stores.q = ["redis://r1"]"#,
        "stores.q: a quorum needs at least two stores",
    ),
    (r#"stores.q = []"#, "stores.q: the list of stores is empty"),
    (
        r#"stores.q = ["redis://:s3cret@r1", "bogus://:s3cret@r2"]"#,
        "stores.q[1]: unsupported connection \"bogus:\"",
    ),
    (
        r#"stores.t = { ttl = "1s" }"#,
        "stores.t: no store: give dsn",
    ),
    (
        r#"stores.t = { dsn = "flock", dsns = ["flock"] }"#,
        "stores.t: give dsn or dsns, not both",
    ),
    (
        r#"stores.t = { dsn = "flock", strategy = "unanimous" }"#,
        "stores.t: a strategy applies to a quorum",
    ),
    (
        r#"stores.t = { dsns = ["redis://a", "redis://b"], strategy = "most" }"#,
        "stores.t: unknown strategy \"most\"",
    ),
    (
        r#"stores.t = { dsn = "flock", ttl = "soon" }"#,
        "stores.t.ttl: \"soon\" is not a period",
    ),
    (
        r#"stores.t = { dsn = "flock", wait = -1 }"#,
        "stores.t.wait: -1 is not a period",
    ),
    (
        r#"stores.t = { dsn = "flock", ttl = "4000days" }"#,
        "stores.t.ttl: too long",
    ),
    (r#"ttl = "later""#, "ttl: \"later\" is not a period"),
    (r#"wait = "never""#, "wait: \"never\" is not a period"),
    (
        r#"default = "nope""#,
        "default: no entry named \"nope\" (the entries: default)",
    ),
];

#[test]
fn every_problem_is_reported_at_once_naming_its_entry() {
    for (toml, want) in ONE_PROBLEM_EACH {
        // The entry under test is the default, so that only its own problem shows.
        let named = want
            .strip_prefix("stores.")
            .map(|w| w.split(['.', ':', '[']).next().unwrap());
        let toml = match named {
            Some(name) => format!("default = \"{name}\"\n{toml}"),
            None => toml.to_string(),
        };
        let got = problems(&toml);
        assert_eq!(got.len(), 1, "{toml}: {got:?}");
        assert!(
            got[0].starts_with(want),
            "{toml}:\n got  {:?}\n want {want:?}…",
            got[0]
        );
    }
    // Several at once, in entry order.
    let got = problems(
        r#"
ttl = "later"
default = "missing"
[stores]
a = "redis://:${NOPE}@h"
b = "flock"
c = "nosuch://x"
"#,
    );
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(got[0].starts_with("ttl: "));
    assert!(got[1].starts_with("stores.a: ${NOPE}"));
    assert!(got[2].starts_with("stores.c: "));
    assert!(got[3].starts_with("default: no entry named \"missing\" (the entries: a, b, c)"));
}

#[test]
fn toml_errors_name_the_line_and_never_quote_the_text() {
    for (toml, want) in [
        (
            "stores.x = \"redis://:s3cret@h\"\nbogus = 1\n",
            "line 2: unknown field `bogus`",
        ),
        (
            "[stores]\nx = { dsn = \"redis://:s3cret@h\", colour = \"red\" }\n",
            "line 2:",
        ),
        (
            "[stores]\nx = \"redis://:s3cret@h\nbroken",
            "is not valid: line ",
        ),
        ("prefix = 5", "line 1: invalid type"),
    ] {
        let err = LocksConfig::from_toml_str(toml).unwrap_err().to_string();
        assert!(!err.contains("s3cret"), "{err}");
        assert!(!err.contains('\n'), "one line: {err}");
        assert!(err.contains(want), "{toml}: {err}");
    }
}

#[test]
fn files_are_read_and_named_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.toml");
    std::fs::write(&path, "[stores]\ndefault = \"in-memory\"\n").unwrap();
    let config = LocksConfig::from_toml_file(&path).unwrap();
    assert_eq!(
        config.check_with(&env).unwrap().entries["default"]
            .store
            .dsns(),
        ["in-memory"]
    );
    std::fs::write(&path, "stores = 3\n").unwrap();
    let err = LocksConfig::from_toml_file(&path).unwrap_err().to_string();
    assert!(err.contains("locks.toml is not valid: line 1"), "{err}");
    let err = LocksConfig::from_toml_file(dir.path().join("missing.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot read the lock configuration") && err.contains("missing.toml"),
        "{err}"
    );
}

#[test]
fn it_embeds_in_an_applications_own_configuration() {
    #[derive(Deserialize)]
    struct App {
        name: String,
        #[serde(default)]
        locks: LocksConfig,
    }
    let app: App = toml::from_str(
        "name = \"billing\"\n[locks]\nprefix = \"b:\"\n[locks.stores]\ndefault = \"in-memory\"\n",
    )
    .unwrap();
    assert_eq!(app.name, "billing");
    assert_eq!(
        app.locks.check_with(&env).unwrap().entries["default"].prefix,
        "b:"
    );
    let bare: App = toml::from_str("name = \"x\"").unwrap();
    assert_eq!(
        bare.locks.check_with(&env).unwrap().entries["default"]
            .store
            .dsns(),
        ["flock"]
    );
    // And back: what it serializes reads the same.
    let text = toml::to_string(&app.locks).unwrap();
    assert_eq!(LocksConfig::from_toml_str(&text).unwrap(), app.locks);
}
