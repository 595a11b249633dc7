//! The Redis DSN parser's tests (`config.rs`).

use super::*;

#[test]
fn dsns_parse_into_what_the_client_sees() {
    let cases = [
        (
            "redis://localhost",
            "redis://localhost:6379/0",
            "redis://localhost:6379/0",
            "",
        ),
        (
            "REDIS://h:7000/3",
            "redis://h:7000/3",
            "redis://h:7000/3",
            "",
        ),
        ("valkey://h/2", "redis://h:6379/2", "redis://h:6379/2", ""),
        ("valkeys://h", "rediss://h:6379/0", "rediss://h:6379/0", ""),
        ("VALKEY://h", "redis://h:6379/0", "redis://h:6379/0", ""),
        (
            "redis://app:s%40cret@h:6380/1?db=4",
            "redis://app:s%40cret@h:6380/4",
            "redis://h:6380/4",
            "",
        ),
        (
            "rediss://:pw@h?prefix=app%3Alocks%3A&socket_timeout=30",
            "rediss://:pw@h:6379/0",
            "rediss://h:6379/0",
            "app:locks:",
        ),
        (
            "redis://h?prefix=a&prefix=b",
            "redis://h:6379/0",
            "redis://h:6379/0",
            "b",
        ),
        (
            "redis://h?prefix=",
            "redis://h:6379/0",
            "redis://h:6379/0",
            "",
        ),
        (
            "redis://h?prefix=a+b",
            "redis://h:6379/0",
            "redis://h:6379/0",
            "a b",
        ),
        (
            "redis://[::1]:7000",
            "redis://[::1]:7000/0",
            "redis://[::1]:7000/0",
            "",
        ),
        (
            "unix:///run/redis.sock?db=2",
            "unix:///run/redis.sock?db=2",
            "unix:///run/redis.sock?db=2",
            "",
        ),
        (
            "unix://u:p@/run/redis.sock",
            "unix:///run/redis.sock?db=0&user=u&pass=p",
            "unix:///run/redis.sock?db=0",
            "",
        ),
    ];
    for (dsn, client, shown, prefix) in cases {
        let c = parse(dsn).unwrap_or_else(|e| panic!("{dsn}: {e}"));
        assert_eq!(c.client_url, client, "{dsn}");
        assert_eq!(c.shown, shown, "{dsn}");
        assert_eq!(c.prefix, prefix, "{dsn}");
    }
}

#[test]
fn timeouts_default_to_5_s_and_can_be_overridden() {
    let c = parse("redis://h").unwrap();
    assert_eq!(
        (c.connect_timeout, c.response_timeout),
        (DEFAULT_TIMEOUT, DEFAULT_TIMEOUT)
    );
    let c = parse("redis://h?socket_connect_timeout=2&socket_timeout=30").unwrap();
    assert_eq!(c.connect_timeout, Duration::from_secs(2));
    assert_eq!(c.response_timeout, Duration::from_secs(30));
}

#[test]
fn bad_dsns_are_refused_without_echoing_secrets() {
    for dsn in [
        "mysql://u:hunter2@h/db",
        "redis:h",
        "redis://u:hunter2@",
        "redis://u:hunter2@h:notaport",
        "redis://u:hunter2@h/notadb",
        "redis://u:hunter2@h?socket_timeout=-1",
        "redis://u:hunter2@h?socket_timeout=abc",
        "redis://u:hunter2@h#fragment",
        "unix://u:hunter2@relative",
    ] {
        let err = parse(dsn).unwrap_err();
        let msg = err.to_string();
        assert!(err.is_invalid_argument(), "{dsn}: {msg}");
        assert!(!msg.contains("hunter2"), "{dsn}: {msg}");
        assert!(!format!("{err:?}").contains("hunter2"), "{dsn}");
    }
    assert!(parse("mysql://x").unwrap_err().to_string().starts_with(
        "\"mysql\" is not a Redis scheme; expected one of redis, rediss, valkey, valkeys, unix"
    ));
    let c = parse("redis://u:hunter2@h").unwrap();
    assert!(!format!("{c:?}").contains("hunter2"));
}

#[test]
fn unknown_options_are_refused_by_name() {
    let err = parse("redis://u:hunter2@h?sockettimeout=3").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid Redis connection string \"redis:\": unknown option \"sockettimeout\"; \
         did you mean \"socket_timeout\"?"
    );
    let err = parse("redis://h?ssl_ca_certs=/ca.pem").unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown option \"ssl_ca_certs\"; the options are prefix, db,"),
        "{err}"
    );
    parse("redis://h?health_check_interval=10&client_name=x").expect("redis-py's pool options");
}

#[test]
fn passwords_may_hold_a_slash_and_insecure_may_precede_the_options() {
    let c = parse("redis://:pa/ss@h/3").unwrap();
    assert_eq!(c.client_url, "redis://:pa%2Fss@h:6379/3");
    let c = parse("rediss://h#insecure?prefix=a").unwrap();
    assert_eq!(c.client_url, "rediss://h:6379/0#insecure");
    assert_eq!(c.prefix, "a");
    let c = parse("redis://h?prefix=a#b").unwrap();
    assert_eq!(
        c.prefix, "a",
        "what follows # after the options is not an option"
    );
}

#[test]
fn clusters_and_sentinels_parse_in_both_spellings() {
    let c = parse("redis+cluster://u:pw@a:7000,b:7001,c?prefix=app%3A").unwrap();
    assert_eq!(c.shown, "redis+cluster://a:7000,b:7001,c:6379");
    assert_eq!(c.prefix, "app:");
    let Topology::Cluster { nodes } = &c.topology else {
        panic!("not a cluster")
    };
    assert_eq!(
        nodes,
        &[
            "redis://u:pw@a:7000/0",
            "redis://u:pw@b:7001/0",
            "redis://u:pw@c:6379/0"
        ]
    );
    // Symfony's form: hosts as options, the cluster named by an option.
    let c = parse("redis:?host[a:7000]&host[b:7001]&redis_cluster=1").unwrap();
    assert_eq!(c.shown, "redis+cluster://a:7000,b:7001");
    let c = parse("rediss+cluster://a:7000#insecure").unwrap();
    let Topology::Cluster { nodes } = &c.topology else {
        panic!("not a cluster")
    };
    assert_eq!(nodes, &["rediss://a:7000/0#insecure"]);
    let s = parse("redis+sentinel://:pw@s1,s2:26380/mymaster/2?wait_replicas=1").unwrap();
    assert_eq!(s.shown, "redis+sentinel://s1:26379,s2:26380/mymaster/2");
    let Topology::Sentinel {
        sentinels,
        master,
        db,
        password,
        ..
    } = &s.topology
    else {
        panic!("not Sentinel")
    };
    assert_eq!(sentinels, &["redis://s1:26379", "redis://s2:26380"]);
    assert_eq!(
        (master.as_str(), *db, password.as_deref()),
        ("mymaster", 2, Some("pw"))
    );
    assert_eq!(
        s.durability,
        Some(Durability {
            replicas: 1,
            timeout: super::super::topology::DEFAULT_WAIT_TIMEOUT
        })
    );
    let s = parse("redis:?host[s1:26379]&host[s2:26379]&redis_sentinel=mymaster").unwrap();
    assert_eq!(s.shown, "redis+sentinel://s1:26379,s2:26379/mymaster/0");
    let w = parse("redis://h?wait_replicas=2&wait_timeout=0.25").unwrap();
    assert_eq!(
        w.durability,
        Some(Durability {
            replicas: 2,
            timeout: Duration::from_millis(250)
        })
    );
    assert!(matches!(w.topology, Topology::Single));
}

#[test]
fn fair_is_the_default_and_fair_false_lets_newcomers_barge() {
    assert!(parse("redis://h").unwrap().fair);
    assert!(!parse("redis://h?fair=false").unwrap().fair);
    assert!(parse("redis+cluster://a,b?fair=true").unwrap().fair);
    let err = parse("redis://h?fair=sometimes").unwrap_err().to_string();
    assert!(err.contains("fair"), "{err}");
    // The pub/sub store has no queue to be fair with.
    assert!(crate::store::RedisPubSubStore::from_dsn("redis+pubsub://h?fair=false").is_err());
}

#[test]
fn bad_cluster_and_sentinel_dsns_say_what_is_wrong() {
    for (dsn, says) in [
        ("redis+cluster://u:hunter2@a/3", "database 0 only"),
        ("redis+cluster://", "missing host"),
        ("redis+sentinel://u:hunter2@s1", "master's name"),
        ("redis://a,b", "several hosts"),
        ("redis:?host[a]&host[b]", "several hosts"),
        ("redis+cluster://a?redis_sentinel=m", "disagree"),
        (
            "redis://a?redis_cluster=1&redis_sentinel=m",
            "exclude each other",
        ),
        (
            "redis://a?wait_timeout=1",
            "wait_timeout needs wait_replicas",
        ),
        ("redis://a?wait_replicas=65", "from 0 to 64"),
        ("unix+cluster:///s", "not a Redis scheme"),
        ("redis://a?host[b]=1", "takes no value"),
    ] {
        let err = parse(dsn).unwrap_err().to_string();
        assert!(err.contains(says), "{dsn}: {err}");
        assert!(!err.contains("hunter2"), "{dsn}: {err}");
    }
    let err = read_pubsub("redis+pubsub://a?redis_cluster=1").unwrap_err();
    assert!(err.to_string().contains("needs one server"), "{err}");
}

fn read_pubsub(text: &str) -> Result<RedisConfig> {
    let dsn = Dsn::split_lenient(text, "Redis");
    let mut options = dsn.options();
    read(&dsn, "+pubsub", &mut options)
}
