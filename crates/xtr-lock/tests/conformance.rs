//! The conformance suite, once per store: one test per scenario per store.

mod support;

use std::sync::Arc;

use xtr_lock::conformance::Harness;
use xtr_lock::{InMemoryStore, MonotonicClock, NullStore};

mod memory {
    use super::*;
    xtr_lock::conformance_tests!(|| async { Harness::new(Arc::new(InMemoryStore::new())) });
}

mod memory_expiring {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        Harness::new(Arc::new(InMemoryStore::expiring(Arc::new(MonotonicClock))))
    });
}

mod null {
    use super::*;
    xtr_lock::conformance_tests!(|| async { Harness::new(Arc::new(NullStore::new())) });
}

/// The in-memory store behind a wrapper that adds native waits (emulated over the store), so the
/// native-wait scenarios and the Lock's native path run before a store with its own native wait
/// (flock) lands.
mod memory_native_wait {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        Harness::new(support::Scripted::with_caps(
            InMemoryStore::new(),
            |mut c| {
                c.blocking = true;
                c.blocking_shared = true;
                c
            },
        ))
    });
}

/// The in-memory store without its change notifications: the Lock must fall back to polling.
mod memory_polling {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        Harness::new(support::Scripted::with_caps(
            InMemoryStore::new(),
            |mut c| {
                c.notifies = false;
                // Without `watch` nobody registers in the store's queue.
                c.fair = false;
                c
            },
        ))
    });
}

/// Flock keys do not travel; a lock is taken away by replacing its lock file (someone cleaning
/// lock files up while they are held).
mod flock {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = xtr_lock::FlockStore::in_dir(dir.path()).unwrap();
        let files = store.clone();
        Harness::new(Arc::new(store))
            .keep_alive(dir)
            .with_sabotage(move |key| {
                let path = files.path_for(key.resource());
                Box::pin(async move {
                    std::fs::remove_file(&path).unwrap();
                    std::fs::write(&path, b"").unwrap();
                })
            })
    });
}

mod redis {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let server = xtr_lock_testkit::redis::RedisServer::start();
        let store = xtr_lock::RedisStore::from_dsn(&server.url(0)).unwrap();
        Harness::new(Arc::new(store)).keep_alive(server)
    });
}

/// A Redis Cluster of three masters: every companion key in its resource's slot, sharded wakes.
mod redis_cluster {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let cluster = xtr_lock_testkit::redis_cluster::RedisCluster::start(3, 0);
        let store = xtr_lock::RedisStore::from_dsn(&cluster.dsn()).unwrap();
        Harness::new(Arc::new(store)).keep_alive(cluster)
    });
}

/// A master found through three sentinels (one replica).
mod redis_sentinel {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let group = xtr_lock_testkit::redis_sentinel::RedisSentinelGroup::start("xtr");
        let store = xtr_lock::RedisStore::from_dsn(&group.dsn()).unwrap();
        Harness::new(Arc::new(store)).keep_alive(group)
    });
}

/// The same server with scores on the client's clock: the mode the time probe picks when a
/// server refuses `TIME` in scripts (the Lua scripts' other branch).
mod redis_client_clock {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let server = xtr_lock_testkit::redis::RedisServer::start();
        let store = xtr_lock::RedisStore::from_dsn(&server.url(0))
            .unwrap()
            .force_client_clock();
        Harness::new(Arc::new(store)).keep_alive(server)
    });
}

mod combined_memory {
    use super::*;
    use xtr_lock::store::{CombinedStore, ConsensusStrategy};
    xtr_lock::conformance_tests!(|| async {
        let stores: Vec<Arc<dyn xtr_lock::Store>> = (0..3)
            .map(|_| Arc::new(InMemoryStore::new()) as Arc<dyn xtr_lock::Store>)
            .collect();
        Harness::new(Arc::new(
            CombinedStore::new(stores, ConsensusStrategy).unwrap(),
        ))
    });
}

fn redis_quorum(n: usize) -> Harness {
    use xtr_lock::store::{CombinedStore, ConsensusStrategy};
    let servers: Vec<_> = (0..n)
        .map(|_| xtr_lock_testkit::redis::RedisServer::start())
        .collect();
    let dsns: Vec<String> = servers.iter().map(|s| s.url(0)).collect();
    let dsns: Vec<&str> = dsns.iter().map(String::as_str).collect();
    let store = CombinedStore::from_dsns(&dsns, ConsensusStrategy).unwrap();
    Harness::new(Arc::new(store)).keep_alive(servers)
}

mod combined_redis_3 {
    use super::*;
    xtr_lock::conformance_tests!(|| async { redis_quorum(3) });
}

mod combined_redis_5 {
    use super::*;
    xtr_lock::conformance_tests!(|| async { redis_quorum(5) });
}

/// The pub/sub store: a lock is a live subscription; it is taken away by killing the holder's
/// connection, as portalocker's waiters reap a holder that does not answer.
mod redis_pubsub {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let server = xtr_lock_testkit::redis::RedisServer::start();
        let url = server.url(0);
        let store =
            xtr_lock::RedisPubSubStore::from_dsn(&url.replacen("redis://", "redis+pubsub://", 1))
                .unwrap();
        let named = store.clone();
        Harness::new(Arc::new(store))
            .with_name_rule(|name| {
                !name.is_empty() && name.bytes().all(|b| (0x21..=0x7e).contains(&b))
            })
            .with_sabotage(move |key| {
                let name = named.connection_name(&key).expect("a holder's connection");
                let url = url.clone();
                Box::pin(async move { support::kill_client_named(&url, &name).await })
            })
            .keep_alive(server)
    });
}

/// The SQL table store keeps whole seconds and refuses ttls under 2 s: its timed scenarios run
/// eight times slower (a 0.3 s ttl becomes 2.4 s).
const SQL_TIME_SCALE: u32 = 8;

mod sql_postgres {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let server = xtr_lock_testkit::postgres::PostgresServer::start();
        let store =
            xtr_lock::SqlStore::from_dsn(&format!("{}?create_table=true", server.url())).unwrap();
        Harness::new(Arc::new(store))
            .with_time_scale(SQL_TIME_SCALE)
            .keep_alive(server)
    });
}

mod sql_mariadb {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let server = xtr_lock_testkit::mariadb::MariaDbServer::start();
        let store =
            xtr_lock::SqlStore::from_dsn(&format!("{}?create_table=true", server.url())).unwrap();
        Harness::new(Arc::new(store))
            .with_time_scale(SQL_TIME_SCALE)
            .keep_alive(server)
    });
}

mod sql_sqlite {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let dir = tempfile::tempdir().unwrap();
        let dsn = format!(
            "sqlite://{}?create_table=true",
            dir.path().join("locks.db").display()
        );
        let store = xtr_lock::SqlStore::from_dsn(&dsn).unwrap();
        Harness::new(Arc::new(store))
            .with_time_scale(SQL_TIME_SCALE)
            .keep_alive(dir)
    });
}

/// `postgres://…` of a testkit server as the advisory store's DSN.
fn advisory_dsn(server: &xtr_lock_testkit::postgres::PostgresServer, options: &str) -> String {
    let url = server.url();
    let rest = url.strip_prefix("postgres").expect("a postgres:// url");
    format!("postgresql+advisory{rest}{options}")
}

mod pg_advisory {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let server = xtr_lock_testkit::postgres::PostgresServer::start();
        let store = xtr_lock::PgAdvisoryStore::from_dsn(&advisory_dsn(&server, "")).unwrap();
        // Its waiters wait in the server's lock queue, which `holders` does not show.
        Harness::new(Arc::new(store))
            .hiding_waiters()
            .keep_alive(server)
    });
}

mod pg_advisory_crc32 {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let server = xtr_lock_testkit::postgres::PostgresServer::start();
        let store =
            xtr_lock::PgAdvisoryStore::from_dsn(&advisory_dsn(&server, "?keys=crc32")).unwrap();
        Harness::new(Arc::new(store))
            .hiding_waiters()
            .keep_alive(server)
    });
}

mod mysql_getlock {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let server = xtr_lock_testkit::mariadb::MariaDbServer::start();
        let url = server.url();
        let dsn = format!("mysql+getlock{}", url.strip_prefix("mysql").unwrap());
        let store = xtr_lock::MySqlLockStore::from_dsn(&dsn).unwrap();
        Harness::new(Arc::new(store)).keep_alive(server)
    });
}

/// An etcd store on `cluster`, with a 5 s lease (what a holder that dies leaves behind), and a
/// sabotage that deletes the resource's keys the way an operator would, with `etcdctl del`
/// (a semaphore's in its own directory).
fn etcd_harness(cluster: xtr_lock_testkit::etcd::EtcdCluster) -> Harness {
    let store = xtr_lock::EtcdStore::from_dsn(&format!("{}?ttl=5", cluster.dsn(""))).unwrap();
    let cluster = Arc::new(cluster);
    let sabotage = cluster.clone();
    let dirs = store.clone();
    Harness::new(Arc::new(store))
        .keep_alive(cluster)
        .with_sabotage(move |key| {
            let cluster = sabotage.clone();
            let dir = match key.permits() {
                Some(_) => dirs.semaphore_directory(key.resource()),
                None => dirs.directory(key.resource()),
            };
            Box::pin(async move {
                tokio::task::spawn_blocking(move || {
                    cluster.etcdctl_output(&["del", "--prefix", &dir]);
                })
                .await
                .unwrap();
            })
        })
}

mod etcd {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        etcd_harness(xtr_lock_testkit::etcd::EtcdCluster::single())
    });
}

mod etcd_cluster_3 {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        etcd_harness(xtr_lock_testkit::etcd::EtcdCluster::start(3))
    });
}

/// SysV semaphores, shared with PHP's sysvsem: resources are unique per test, so the machine's
/// semaphores are shared safely with everything else running.
mod semaphore {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        // Taken away as an operator would: `ipcrm -S <key>` removes the holder's set.
        Harness::new(Arc::new(xtr_lock::SemaphoreStore::new())).with_sabotage(|key| {
            let sem_key = xtr_lock::store::semaphore_key(key.resource());
            Box::pin(async move {
                let out = std::process::Command::new("ipcrm")
                    .args(["-S", &format!("{:#x}", sem_key as u32)])
                    .output()
                    .expect("ipcrm (util-linux)");
                assert!(out.status.success(), "ipcrm: {out:?}");
            })
        })
    });
}

/// Memcached keeps whole seconds (an entry may end up to 1 s early) and refuses ttls under
/// 2 s, like the SQL table store; names are its keys, unchanged.
mod memcached {
    use super::*;
    xtr_lock::conformance_tests!(|| async {
        let server = xtr_lock_testkit::memcached::MemcachedServer::start();
        let store = xtr_lock::MemcachedStore::from_dsn(&server.url()).unwrap();
        let port = server.port();
        Harness::new(Arc::new(store))
            .with_time_scale(SQL_TIME_SCALE)
            .with_name_rule(xtr_lock::MemcachedStore::is_valid_name)
            // Taken away as an operator would: the entry deleted behind the holder's back.
            .with_sabotage(move |key| {
                Box::pin(async move {
                    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .unwrap();
                    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                    s.write_all(format!("md {}\r\n", key.resource()).as_bytes())
                        .await
                        .unwrap();
                    let mut buf = [0u8; 16];
                    let n = s.read(&mut buf).await.unwrap();
                    assert_eq!(&buf[..n], b"HD\r\n");
                })
            })
            .keep_alive(server)
    });
}
