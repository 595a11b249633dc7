//! The etcd store when the cluster pauses or a partition cuts a holder off: a wait rides out a
//! paused server, leases are revoked when nothing is held (and before `close` returns), a
//! delete cut off by a partition is retried until it lands, and a holder's own stale key never
//! makes it (or anyone) wait for it. Also the ttls a lease cannot keep, refused.

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xtr_lock::{ErrorKind, EtcdStore, LockFactory, Lockable as _, Mode, Store as _};
use xtr_lock_testkit::etcd::EtcdCluster;

const PATIENCE: Duration = Duration::from_secs(20);

fn resource(name: &str) -> String {
    format!("{name}-{:08x}", rand::random::<u32>())
}

fn keys(cluster: &EtcdCluster, dir: &str) -> Vec<String> {
    cluster
        .etcdctl_output(&["get", "--prefix", "--keys-only", dir])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The leases the cluster has (`etcdctl lease list` prints them in hex).
fn leases(cluster: &EtcdCluster) -> Vec<i64> {
    cluster
        .etcdctl_output(&["lease", "list"])
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| i64::from_str_radix(l.trim(), 16).unwrap())
        .collect()
}

async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A TCP proxy to one etcd member that a test can cut off: while cut, every byte either way
/// is dropped and nothing is closed (a partition, not a refusal). It can also cut itself off
/// for a while the moment the client sends a chunk that contains a given pattern (one
/// request's key).
#[derive(Clone)]
struct Partition {
    port: u16,
    cut: Arc<AtomicBool>,
    trip: Arc<Mutex<Option<Trip>>>,
}

/// A pattern that cuts the proxy off, and for how long.
type Trip = (Vec<u8>, Duration);

impl Partition {
    fn start(target: u16) -> Partition {
        let mut p = Partition {
            port: 0,
            cut: Arc::new(AtomicBool::new(false)),
            trip: Arc::new(Mutex::new(None)),
        };
        let proxy = p.clone();
        p.port = xtr_lock_testkit::proxy::start(target, move |link| {
            let (up, down) = (proxy.clone(), proxy.clone());
            let (client_r, server_w) = (link.client_r, link.server_w);
            std::thread::spawn(move || up.pump(client_r, server_w, true));
            let (server_r, client_w) = (link.server_r, link.client_w);
            std::thread::spawn(move || down.pump(server_r, client_w, false));
        });
        p
    }

    fn pump(&self, mut from: TcpStream, mut to: TcpStream, upstream: bool) {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            if upstream {
                self.maybe_trip(&buf[..n]);
            }
            if self.cut.load(Ordering::SeqCst) {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    }

    fn maybe_trip(&self, chunk: &[u8]) {
        let mut trip = self.trip.lock().unwrap();
        let hit = trip
            .as_ref()
            .is_some_and(|(p, _)| chunk.windows(p.len()).any(|w| w == p.as_slice()));
        if hit {
            let (_, how_long) = trip.take().unwrap();
            self.set_cut(true);
            let me = self.clone();
            std::thread::spawn(move || {
                std::thread::sleep(how_long);
                me.set_cut(false);
            });
        }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// Cuts itself off for `how_long` when the client next sends `pattern`; the chunk that
    /// carried it is dropped too.
    fn trip_on(&self, pattern: Vec<u8>, how_long: Duration) {
        *self.trip.lock().unwrap() = Some((pattern, how_long));
    }

    fn tripped(&self) -> bool {
        self.trip.lock().unwrap().is_none()
    }
}

/// How a transaction's delete of `key` starts on the wire (a `RequestOp` whose
/// `request_delete_range`, field 3, has `key` as its field 1): nothing else a holder sends
/// carries it (a watch or a put of the key is framed otherwise).
fn delete_range(key: &str) -> Vec<u8> {
    let len = u8::try_from(key.len()).unwrap();
    assert!(len < 126, "one-byte lengths");
    let mut p = vec![0x1a, len + 2, 0x0a, len];
    p.extend_from_slice(key.as_bytes());
    p
}

fn port_of(cluster: &EtcdCluster) -> u16 {
    let endpoint = &cluster.endpoints()[0];
    endpoint.rsplit(':').next().unwrap().parse().unwrap()
}

/// A store reaching the single member of `cluster` through `proxy`, with short timeouts.
fn through(proxy: &Partition) -> Arc<EtcdStore> {
    Arc::new(
        EtcdStore::from_dsn(&format!(
            "etcd://127.0.0.1:{}?request_timeout=1&connect_timeout=1",
            proxy.port
        ))
        .unwrap(),
    )
}

/// `etcdctl lock NAME -- true` finishes: nothing is left that blocks a writer of etcd's recipe.
async fn etcdctl_takes(cluster: &EtcdCluster, name: &str) {
    let mut child = cluster
        .etcdctl()
        .args(["lock", name, "--", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "etcdctl lock failed");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "etcdctl lock {name} did not get the lock within {PATIENCE:?}: {:?}",
                keys(cluster, &format!("{name}/"))
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A waiter with a 2 s lease (`run -w 60s` in the issue) while the only member is stopped for
/// 6 s: its lease's confirmed end passes while nothing answers, which is no reason for a wait
/// to give up. It gets the lock once the cluster is back and the holder's lease (which really
/// could have ended) is gone; the holder is told it lost the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_rides_out_a_paused_server() {
    let cluster = EtcdCluster::single();
    let store = Arc::new(EtcdStore::from_dsn(&cluster.dsn("")).unwrap());
    let factory = LockFactory::from_arc(store.clone()).with_ttl(Some(Duration::from_secs(2)));
    let r = resource("paused-wait");
    let holder = factory.create_lock(&r);
    holder.acquire().await.unwrap();
    let monitor = holder.keep_alive().unwrap();
    let waiter = factory.create_lock(&r);
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire_timeout(Duration::from_secs(60)).await }
    });
    let deadline = Instant::now() + PATIENCE;
    while store.holders(&r).await.unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "the waiter queues");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.pause(0);
    tokio::time::sleep(Duration::from_secs(6)).await;
    cluster.resume(0);
    let got = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the wait ends")
        .unwrap();
    assert!(got.as_ref().is_ok_and(|g| *g), "the wait gave up: {got:?}");
    assert_eq!(waiter.held_mode(), Some(Mode::Write));
    let lost = tokio::time::timeout(PATIENCE, monitor.lost())
        .await
        .expect("the holder, whose lease could have ended, is told");
    assert_eq!(lost.reason, xtr_lock::LostReason::Expired, "{lost}");
    let _ = waiter.release().await.unwrap();
}

/// Every hold's lease is revoked when the hold ends: after acquire/release cycles, tries that
/// failed and waits that gave up, the cluster has no lease of this store's; after `close`, at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_revoked_when_nothing_is_held_and_before_close_returns() {
    let cluster = EtcdCluster::single();
    let store = Arc::new(EtcdStore::from_dsn(&cluster.dsn("")).unwrap());
    let factory = LockFactory::from_arc(store.clone());
    let r = resource("revoked");
    let lock = factory.create_lock(&r);
    for _ in 0..5 {
        lock.acquire().await.unwrap();
        let lease = store.lease_id(lock.key()).unwrap();
        assert!(leases(&cluster).contains(&lease), "{lease:x} is granted");
        let _ = lock.release().await.unwrap();
        until("the released hold's lease is revoked", || {
            leases(&cluster).is_empty()
        })
        .await;
    }
    lock.acquire_read().await.unwrap();
    let other = factory.create_lock(&r);
    assert!(!other.try_acquire().await.unwrap());
    assert!(
        !other
            .acquire_timeout(Duration::from_millis(300))
            .await
            .unwrap()
    );
    until("only the holder's lease is left", || {
        leases(&cluster).len() == 1
    })
    .await;
    let _ = lock.release().await.unwrap();
    store.close().await.unwrap();
    assert_eq!(leases(&cluster), Vec::<i64>::new(), "after close");
    assert!(keys(&cluster, &store.directory(&r)).is_empty());
}

/// A promotion is granted, and the delete of its read key is cut off by a partition: the
/// delete is tried again until it lands; meanwhile the stale read key (on the holder's own
/// lease) never makes the holder wait for itself, and afterwards nothing blocks anyone,
/// `etcdctl lock` included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotions_read_key_delete_cut_off_is_retried_and_never_blocks() {
    let cluster = EtcdCluster::single();
    let proxy = Partition::start(port_of(&cluster));
    let store = through(&proxy);
    let factory = LockFactory::from_arc(store.clone()).with_ttl(Some(Duration::from_secs(30)));
    let r = resource("stale-read");
    let dir = store.directory(&r);
    let lock = factory.create_lock(&r);
    assert!(lock.try_acquire_read().await.unwrap());
    let lease = store.lease_id(lock.key()).unwrap();
    let read_key = format!("{dir}r-{lease:x}");
    proxy.trip_on(delete_range(&read_key), Duration::from_secs(4));
    // The promotion holds at once; its read key's delete is what trips the partition.
    let promoted = tokio::time::timeout(PATIENCE, lock.acquire()).await;
    assert!(proxy.tripped(), "the read key's delete was sent");
    assert!(
        matches!(promoted, Ok(Ok(()))),
        "the promotion holds: {promoted:?}"
    );
    assert_eq!(lock.held_mode(), Some(Mode::Write));
    // Cut off, the delete failed; it lands once the partition heals, while the holder holds.
    until("the stale read key's delete lands", || {
        !keys(&cluster, &dir).contains(&read_key)
    })
    .await;
    let _ = lock.release().await.unwrap();
    // Its own keys never keep the holder waiting for itself.
    assert!(
        lock.acquire_timeout(Duration::from_secs(10)).await.unwrap(),
        "the holder waited for its own stale key"
    );
    let _ = lock.release().await.unwrap();
    etcdctl_takes(&cluster, &r).await;
    store.close().await.unwrap();
    assert!(
        keys(&cluster, &dir).is_empty(),
        "{:?}",
        keys(&cluster, &dir)
    );
}

/// A wait given up during a partition cannot delete its queue key: the key goes all the same
/// once the partition heals (its lease is revoked), while the waiter's holder lives on, so the
/// next holder (`etcdctl lock` here) is not blocked by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_given_up_during_a_partition_leaves_no_key_that_blocks() {
    let cluster = EtcdCluster::single();
    let proxy = Partition::start(port_of(&cluster));
    let direct = Arc::new(EtcdStore::from_dsn(&cluster.dsn("")).unwrap());
    let cut_off = through(&proxy);
    let r = resource("given-up");
    let dir = direct.directory(&r);
    let ttl = Some(Duration::from_secs(30));
    let holder = LockFactory::from_arc(direct.clone())
        .with_ttl(ttl)
        .create_lock(&r);
    holder.acquire().await.unwrap();
    let waiter = LockFactory::from_arc(cut_off.clone())
        .with_ttl(ttl)
        .create_lock(&r);
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire_timeout(Duration::from_secs(3)).await }
    });
    until("the waiter queues", || keys(&cluster, &dir).len() == 2).await;
    proxy.set_cut(true);
    let gave_up = waiting.await.unwrap();
    // Its clean-up is cut off too (the partition lasts beyond a request's tries).
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.set_cut(false);
    assert!(!gave_up.unwrap_or(false), "the wait gave up");
    let _ = holder.release().await.unwrap();
    etcdctl_takes(&cluster, &r).await;
    until("nothing is left", || keys(&cluster, &dir).is_empty()).await;
    assert!(waiter.held_mode().is_none());
    drop(waiter);
}

/// A lease is whole seconds, at least one: a ttl it cannot keep is refused before anything is
/// stored, in one line that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_a_lease_cannot_keep_are_refused() {
    let cluster = EtcdCluster::single();
    let store = Arc::new(EtcdStore::from_dsn(&cluster.dsn("")).unwrap());
    let factory = LockFactory::from_arc(store.clone());
    let r = resource("ttl");
    for ttl in [Duration::from_millis(500), Duration::from_millis(1500)] {
        let lock = factory.create_lock(&r).with_ttl(Some(ttl));
        let err = lock.acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        let text = err.to_string();
        assert!(text.contains("whole seconds"), "{text}");
        assert!(!text.contains('\n'), "{text}");
        assert!(leases(&cluster).is_empty(), "nothing granted for {ttl:?}");
    }
    let lock = factory
        .create_lock(&r)
        .with_ttl(Some(Duration::from_secs(2)));
    lock.acquire().await.unwrap();
    let _ = lock.release().await.unwrap();
    for dsn in ["?ttl=0.5", "?ttl=1.5"] {
        let err = EtcdStore::from_dsn(&format!("{}{dsn}", cluster.dsn(""))).unwrap_err();
        assert!(err.to_string().contains("whole seconds"), "{err}");
    }
}

/// A cluster that is not there is reported with its cause (the refused connection), not only
/// the gRPC status's "tcp connect error".
#[tokio::test]
async fn an_unreachable_cluster_is_reported_with_its_cause() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = xtr_lock::StoreFactory::create_store(&format!("etcd://127.0.0.1:{port}")).unwrap();
    let lock = xtr_lock::LockFactory::from_arc(store).create_lock("nobody-home");
    let err = lock.try_acquire().await.unwrap_err();
    let said = xtr_lock::Report::new(&err).to_string();
    assert!(said.to_lowercase().contains("connection refused"), "{said}");
    assert!(err.is_temporary(), "{said}");
}
