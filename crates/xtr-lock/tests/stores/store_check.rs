//! The stores' pre-flight check (`Store::check`) on real servers started as the warning needs:
//! Redis evicting, replicating, a replica, refusing `CONFIG`; Memcached evicting or not; a
//! quorum naming its members.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::store::{CombinedStore, ConsensusStrategy, Severity, StoreWarning};
use xtr_lock::{MemcachedStore, RedisStore, Store};
use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::master_and_replica;
use xtr_lock_testkit::redis_cluster::RedisCluster;

/// The warnings (notes left out) of `store`, by code.
async fn warnings(store: &dyn Store) -> Vec<StoreWarning> {
    let found = store.check().await.expect("the server answers");
    for w in &found {
        let line = w.to_string();
        assert!(!line.contains('\n'), "one line: {line}");
        assert!(
            line.starts_with(&store.to_string()),
            "names the store: {line}"
        );
    }
    found
        .into_iter()
        .filter(|w| w.severity() == Severity::Warning)
        .collect()
}

fn codes(found: &[StoreWarning]) -> Vec<&'static str> {
    found.iter().map(StoreWarning::code).collect()
}

async fn redis_warnings(server: &RedisServer) -> Vec<StoreWarning> {
    warnings(&RedisStore::from_dsn(&server.url(0)).unwrap()).await
}

#[tokio::test]
async fn redis_evicting_any_key_is_a_warning() {
    let server =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]);
    let found = redis_warnings(&server).await;
    assert_eq!(codes(&found), ["eviction"], "{found:?}");
    assert!(found[0].problem().contains("allkeys-lru"), "{}", found[0]);
    assert!(found[0].remedy().contains("noeviction"), "{}", found[0]);
}

#[tokio::test]
async fn redis_evicting_keys_with_a_ttl_is_a_warning() {
    let server =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"]);
    let found = redis_warnings(&server).await;
    assert_eq!(codes(&found), ["eviction"], "{found:?}");
    assert!(found[0].risk().contains("ttl"), "{}", found[0]);
}

#[tokio::test]
async fn redis_evicting_without_a_memory_limit_is_no_warning() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    assert_eq!(codes(&redis_warnings(&server).await), Vec::<&str>::new());
}

#[tokio::test]
async fn redis_by_default_has_no_warning_and_a_note_on_persistence() {
    let server = RedisServer::start();
    let store = RedisStore::from_dsn(&server.url(0)).unwrap();
    let found = store.check().await.unwrap();
    assert_eq!(codes(&found), ["persistence"], "{found:?}");
    assert_eq!(found[0].severity(), Severity::Note);
}

#[tokio::test]
async fn a_redis_master_with_a_replica_and_no_wait_is_a_warning() {
    let (master, _replica) = master_and_replica();
    let found = redis_warnings(&master).await;
    assert_eq!(codes(&found), ["replication"], "{found:?}");
    assert!(
        found[0].remedy().contains("wait_replicas=1"),
        "{}",
        found[0]
    );
}

#[tokio::test]
async fn a_redis_replica_named_by_the_dsn_is_a_warning() {
    let (_master, replica) = master_and_replica();
    let found = redis_warnings(&replica).await;
    assert_eq!(codes(&found), ["replica"], "{found:?}");
}

#[tokio::test]
async fn redis_refusing_config_is_checked_from_info() {
    let server = RedisServer::start_with(&[
        "--rename-command",
        "CONFIG",
        "",
        "--maxmemory",
        "100mb",
        "--maxmemory-policy",
        "allkeys-lfu",
    ]);
    let found = redis_warnings(&server).await;
    assert_eq!(codes(&found), ["eviction"], "{found:?}");
    assert!(found[0].problem().contains("allkeys-lfu"), "{}", found[0]);
}

#[tokio::test]
async fn redis_refusing_config_and_info_could_not_be_checked() {
    let server = RedisServer::start_with(&[
        "--rename-command",
        "CONFIG",
        "",
        "--rename-command",
        "INFO",
        "",
    ]);
    let found = redis_warnings(&server).await;
    assert_eq!(codes(&found), ["unchecked", "unchecked"], "{found:?}");
    assert!(
        found[0].problem().contains("could not check"),
        "{}",
        found[0]
    );
    assert!(found[0].problem().contains("CONFIG"), "{}", found[0]);
    assert!(found[1].problem().contains("INFO"), "{}", found[1]);
}

#[tokio::test]
async fn redis_that_cannot_be_reached_is_an_error() {
    let mut server = RedisServer::start();
    let store = RedisStore::from_dsn(&server.url(0)).unwrap();
    server.kill();
    let err = store.check().await.unwrap_err();
    assert_eq!(err.kind(), xtr_lock::ErrorKind::Storage, "{err}");
}

#[tokio::test]
async fn redis_warnings_never_show_a_password() {
    let server = RedisServer::start_with(&[
        "--requirepass",
        "s3cret-pw",
        "--maxmemory",
        "100mb",
        "--maxmemory-policy",
        "allkeys-lru",
    ]);
    let dsn = format!("redis://:s3cret-pw@127.0.0.1:{}/0", server.port());
    let found = warnings(&RedisStore::from_dsn(&dsn).unwrap()).await;
    assert_eq!(codes(&found), ["eviction"]);
    assert!(!format!("{found:?} {}", found[0]).contains("s3cret"));
}

#[tokio::test]
async fn memcached_evicting_is_a_warning_and_with_m_is_not() {
    let evicting = MemcachedServer::start();
    let found = warnings(&MemcachedStore::from_dsn(&evicting.url()).unwrap()).await;
    assert_eq!(codes(&found), ["eviction"], "{found:?}");
    assert!(found[0].remedy().contains("-M"), "{}", found[0]);
    let refusing = MemcachedServer::start_with(&["-M"]);
    let store = MemcachedStore::from_dsn(&refusing.url()).unwrap();
    assert_eq!(store.check().await.unwrap(), []);
}

#[tokio::test]
async fn memcached_that_cannot_be_reached_is_an_error() {
    let mut server = MemcachedServer::start();
    let store = MemcachedStore::from_dsn(&server.url()).unwrap();
    server.kill();
    assert!(store.check().await.is_err());
}

#[tokio::test]
async fn a_quorum_gathers_its_members_warnings_each_naming_its_member() {
    let evicting =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]);
    let plain = RedisServer::start();
    let mut gone = RedisServer::start();
    let members: Vec<Arc<dyn Store>> = [&evicting, &plain, &gone]
        .iter()
        .map(|s| Arc::new(RedisStore::from_dsn(&s.url(0)).unwrap()) as Arc<dyn Store>)
        .collect();
    let names: Vec<String> = members.iter().map(ToString::to_string).collect();
    gone.kill();
    let quorum = CombinedStore::new(members, ConsensusStrategy).unwrap();
    let found: Vec<StoreWarning> = quorum
        .check()
        .await
        .unwrap()
        .into_iter()
        .filter(|w| w.severity() == Severity::Warning)
        .collect();
    assert_eq!(codes(&found), ["eviction", "member"], "{found:?}");
    assert_eq!(found[0].store(), names[0]);
    assert_eq!(found[1].store(), names[2]);
}

#[tokio::test]
async fn a_redis_master_whose_writes_wait_for_its_replica_is_no_warning() {
    let (master, _replica) = master_and_replica();
    let dsn = format!("{}?wait_replicas=1", master.url(0));
    let found = warnings(&RedisStore::from_dsn(&dsn).unwrap()).await;
    assert_eq!(codes(&found), Vec::<&str>::new(), "{found:?}");
}

#[tokio::test]
async fn a_redis_cluster_is_checked_master_by_master_each_named() {
    let cluster = RedisCluster::start(2, 1);
    let store = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let found = warnings(&store).await;
    assert_eq!(codes(&found), ["replication", "replication"], "{found:?}");
    for port in cluster.masters() {
        let node = format!("(node 127.0.0.1:{port})");
        assert!(
            found.iter().any(|w| w.store().ends_with(&node)),
            "{node}: {found:?}"
        );
    }
    let waiting = RedisStore::from_dsn(&format!("{}?wait_replicas=1", cluster.dsn())).unwrap();
    assert_eq!(codes(&warnings(&waiting).await), Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_with_a_failed_master_is_a_warning() {
    let mut cluster = RedisCluster::start(3, 0);
    let seeds = cluster.dsn();
    let store = RedisStore::from_dsn(&seeds).unwrap();
    assert!(!codes(&warnings(&store).await).contains(&"cluster"));
    // A master with no replica dies: its slots have nobody, the cluster's state is fail.
    let gone = cluster.masters()[2];
    cluster.kill(gone);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let store = RedisStore::from_dsn(&seeds).unwrap();
        // The dead master is named: as one that cannot be asked at once, and as flagged
        // failing once the others agree (their node timeout); the check itself still answers.
        let named = format!("127.0.0.1:{gone}");
        match store.check().await {
            Ok(found)
                if found
                    .iter()
                    .any(|w| w.code() == "cluster" && w.to_string().contains(&named)) =>
            {
                break;
            }
            // The client cannot map the slots of a cluster in trouble yet.
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            other => panic!("no cluster warning 20 s after a master died: {other:?}"),
        }
    }
}

/// A replica that died is seen only in the masters' view of the cluster (the check asks the
/// masters): flagged failing once they agree, and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_with_a_failed_replica_is_a_warning_naming_it() {
    let mut cluster = RedisCluster::start(3, 1);
    let store = RedisStore::from_dsn(&format!("{}?wait_replicas=1", cluster.dsn())).unwrap();
    assert_eq!(codes(&warnings(&store).await), Vec::<&str>::new());
    let gone = cluster.replicas()[0];
    cluster.kill(gone);
    let named = format!("flagged failing: 127.0.0.1:{gone}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = store.check().await.unwrap();
        if found
            .iter()
            .any(|w| w.code() == "cluster" && w.to_string().contains(&named))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no warning naming the dead replica 20 s after it died: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
