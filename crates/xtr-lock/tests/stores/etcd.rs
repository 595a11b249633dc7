//! The etcd store on clusters the testkit starts: `etcdctl lock` both ways (and its
//! `ETCD_LOCK_REV` against our tokens), FIFO order, promotions that give way, dropped waits that
//! leave no queue key, a revoked lease reported lost at once, a lock that outlives its ttl while
//! its holder lives, and the cluster's faults (a leader killed with a holder and a queue, a
//! minority paused, the majority lost).

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xtr_lock::store::Holding;
use xtr_lock::{EtcdStore, LockFactory, Lockable as _, Mode, Release, Store as _};
use xtr_lock_testkit::etcd::EtcdCluster;

const PATIENCE: Duration = Duration::from_secs(20);

pub(super) fn store(cluster: &EtcdCluster, options: &str) -> Arc<EtcdStore> {
    Arc::new(EtcdStore::from_dsn(&format!("{}{options}", cluster.dsn(""))).unwrap())
}

pub(super) fn resource(name: &str) -> String {
    format!("{name}-{:08x}", rand::random::<u32>())
}

/// The keys under `dir`, as `etcdctl get --prefix --keys-only` lists them.
pub(super) fn keys(cluster: &EtcdCluster, dir: &str) -> Vec<String> {
    cluster
        .etcdctl_output(&["get", "--prefix", "--keys-only", dir])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Waits until `ok` holds, failing with `what` after the patience.
pub(super) async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts `cmd` (an `etcdctl` command) and sends what `pick` takes from each line of its
/// output on a channel.
pub(super) fn spawn_lines<T: Send + 'static>(
    cmd: &mut std::process::Command,
    pick: impl Fn(String) -> Option<T> + Send + 'static,
) -> (Child, std::sync::mpsc::Receiver<T>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcdctl (apt-get install etcd-client)");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(v) = pick(line) {
                let _ = tx.send(v);
            }
        }
    });
    (child, rx)
}

/// `etcdctl lock NAME -- sh -c 'echo $ETCD_LOCK_REV; sleep S'`: prints the revision once it holds.
fn etcdctl_lock(
    cluster: &EtcdCluster,
    name: &str,
    hold_secs: u32,
) -> (Child, std::sync::mpsc::Receiver<u64>) {
    let mut cmd = cluster.etcdctl();
    cmd.args(["lock", name, "--", "sh", "-c"])
        .arg(format!("echo rev=$ETCD_LOCK_REV; sleep {hold_secs}"));
    spawn_lines(&mut cmd, |line| {
        line.strip_prefix("rev=")
            .map(|rev| rev.trim().parse().unwrap())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_ours_exclude_each_other_both_ways_with_comparable_tokens() {
    let cluster = EtcdCluster::single();
    let r = resource("etcdctl");
    let factory = LockFactory::from_arc(store(&cluster, ""));

    // Ours first: etcdctl waits until we release, and its revision comes after our token.
    let ours = factory.create_lock(&r);
    ours.acquire().await.unwrap();
    let token = ours.fencing_token().unwrap();
    let (mut child, revs) = etcdctl_lock(&cluster, &r, 1);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        revs.try_recv().is_err(),
        "etcdctl lock must wait while we hold"
    );
    assert_eq!(ours.release().await.unwrap(), Release::Released);
    let theirs = tokio::task::spawn_blocking(move || revs.recv_timeout(PATIENCE).unwrap())
        .await
        .unwrap();
    assert!(theirs > token, "ETCD_LOCK_REV {theirs} > our token {token}");

    // Theirs now: we cannot take it, and wait for it; our token comes after its revision.
    let other = factory.create_lock(&r);
    assert!(!other.try_acquire().await.unwrap(), "etcdctl holds it");
    let holders = factory.store().holders(&r).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert!(
        holders[0].backend.as_deref().unwrap().starts_with("lease "),
        "{holders:?}"
    );
    tokio::time::timeout(PATIENCE, other.acquire())
        .await
        .unwrap()
        .unwrap();
    let next = other.fencing_token().unwrap();
    assert!(next > theirs, "our token {next} > ETCD_LOCK_REV {theirs}");
    assert!(child.wait().unwrap().success());
    let _ = other.release().await.unwrap();

    // A reader excludes etcdctl too.
    let reader = factory.create_lock(&r);
    assert!(reader.try_acquire_read().await.unwrap());
    let (mut child, revs) = etcdctl_lock(&cluster, &r, 0);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(revs.try_recv().is_err(), "etcdctl lock waits for a reader");
    let _ = reader.release().await.unwrap();
    tokio::task::spawn_blocking(move || revs.recv_timeout(PATIENCE).unwrap())
        .await
        .unwrap();
    assert!(child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_the_order_they_queued() {
    let cluster = EtcdCluster::single();
    let r = resource("fifo");
    let store = store(&cluster, "");
    let factory = LockFactory::from_arc(store.clone());
    let first = factory.create_lock(&r);
    first.acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let lock = factory.create_lock(&r);
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            lock.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(10)).await;
            let _ = lock.release().await.unwrap();
        }));
        // The next waiter queues only once this one has its key.
        let want = i + 2;
        let deadline = Instant::now() + PATIENCE;
        while store.holders(&r).await.unwrap().len() < want {
            assert!(Instant::now() < deadline, "waiter {i} queues");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let queue = store.holders(&r).await.unwrap();
    assert!(
        !queue[0].waiting && queue[1..].iter().all(|h| h.waiting),
        "{queue:?}"
    );
    let _ = first.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(PATIENCE, t).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
    assert!(keys(&cluster, &store.directory(&r)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_readers_promoting_at_once_do_not_deadlock_the_later_gives_way() {
    let cluster = EtcdCluster::single();
    let r = resource("promote");
    let store = store(&cluster, "");
    let factory = LockFactory::from_arc(store.clone());
    let (a, b) = (factory.create_lock(&r), factory.create_lock(&r));
    assert!(a.try_acquire_read().await.unwrap());
    assert!(b.try_acquire_read().await.unwrap());
    let promoting = tokio::spawn({
        let a = a.clone();
        async move { a.acquire().await }
    });
    // A's writer key is queued behind B's read key.
    until_queued(&store, &r, 3).await;
    let err = tokio::time::timeout(PATIENCE, b.acquire())
        .await
        .expect("B's promotion answers at once")
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert!(err.to_string().contains("deadlock"), "{err}");
    assert_eq!(b.held_mode(), Some(Mode::Read), "B keeps reading");
    assert!(!promoting.is_finished(), "A still waits for B's read lock");
    let _ = b.release().await.unwrap();
    tokio::time::timeout(PATIENCE, promoting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(a.held_mode(), Some(Mode::Write));
    let left = keys(&cluster, &store.directory(&r));
    assert_eq!(left.len(), 1, "only A's writer key: {left:?}");
    let _ = a.release().await.unwrap();
}

async fn until_queued(store: &EtcdStore, r: &str, n: usize) {
    let deadline = Instant::now() + PATIENCE;
    while store.holders(r).await.unwrap().len() < n {
        assert!(Instant::now() < deadline, "{n} keys queue");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_leaves_no_queue_key_and_a_dropped_promotion_keeps_the_read_lock() {
    let cluster = EtcdCluster::single();
    let r = resource("dropped");
    let store = store(&cluster, "");
    let factory = LockFactory::from_arc(store.clone());
    let holder = factory.create_lock(&r);
    assert!(holder.try_acquire_read().await.unwrap());
    let other = factory.create_lock(&r);
    assert!(other.try_acquire_read().await.unwrap());
    let waiter = factory.create_lock(&r);
    let dir = store.directory(&r);
    for _ in 0..3 {
        let wait = waiter.acquire_timeout(Duration::from_millis(300)).await;
        assert!(!wait.unwrap(), "the wait times out");
        until("the dropped wait's key goes", || {
            keys(&cluster, &dir).len() == 2
        })
        .await;
    }
    // A promotion given up keeps its read lock and takes its writer key back.
    let promote = other.acquire_timeout(Duration::from_millis(300)).await;
    assert!(!promote.unwrap());
    assert_eq!(other.held_mode(), Some(Mode::Read));
    assert_eq!(
        store.exists(other.key()).await.unwrap(),
        Holding::Held(Mode::Read)
    );
    until("the promotion's writer key goes", || {
        keys(&cluster, &dir).len() == 2
    })
    .await;
    let _ = holder.release().await.unwrap();
    let _ = other.release().await.unwrap();
    assert!(keys(&cluster, &dir).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_or_a_deleted_key_is_reported_lost_at_once() {
    let cluster = EtcdCluster::single();
    let store = store(&cluster, "");
    let factory = LockFactory::from_arc(store.clone());
    for how in ["revoke", "del"] {
        let r = resource(how);
        let lock = factory.create_lock(&r);
        lock.acquire().await.unwrap();
        let monitor = lock.keep_alive().unwrap();
        let lease = store.lease_id(lock.key()).unwrap();
        match how {
            "revoke" => cluster.etcdctl_output(&["lease", "revoke", &format!("{lease:x}")]),
            _ => cluster.etcdctl_output(&["del", "--prefix", &store.directory(&r)]),
        };
        let lost = tokio::time::timeout(PATIENCE, monitor.lost())
            .await
            .expect("the loss is reported at once");
        // A delete is seen by the key's watch; a revoke deletes the key too, and the keeper may
        // see the dead lease first.
        match how {
            "del" => assert_eq!(lost.reason, xtr_lock::LostReason::Removed, "{lost}"),
            _ => assert!(
                matches!(
                    lost.reason,
                    xtr_lock::LostReason::Removed | xtr_lock::LostReason::Expired
                ),
                "{lost}"
            ),
        }
        assert_eq!(lock.release().await.unwrap(), Release::Lost);
        // The holder takes it again with a new lease.
        assert!(lock.try_acquire().await.unwrap());
        let _ = lock.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_outlives_its_ttl_while_its_holder_lives() {
    let cluster = EtcdCluster::single();
    let r = resource("outlives");
    let store = store(&cluster, "");
    let factory = LockFactory::from_arc(store.clone());
    let lock = factory
        .create_lock(&r)
        .with_ttl(Some(Duration::from_secs(1)));
    lock.acquire().await.unwrap();
    let remaining = store.lease_remaining(lock.key()).unwrap();
    assert!(remaining <= Duration::from_secs(2), "{remaining:?}");
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(!factory.create_lock(&r).try_acquire().await.unwrap());
    assert_eq!(
        store.exists(lock.key()).await.unwrap(),
        Holding::Held(Mode::Write)
    );
    assert_eq!(lock.release().await.unwrap(), Release::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_and_its_queue_survive_the_leader_killed() {
    let mut cluster = EtcdCluster::start(3);
    let r = resource("leader");
    let store = store(&cluster, "?ttl=10");
    let factory = LockFactory::from_arc(store.clone());
    let holder = factory.create_lock(&r);
    holder.acquire().await.unwrap();
    let monitor = holder.keep_alive().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let lock = factory.create_lock(&r);
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            lock.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            let _ = lock.release().await.unwrap();
        }));
        until_queued(&store, &r, i + 2).await;
    }
    let leader = cluster.wait_leader();
    cluster.kill(leader);
    let next = cluster.wait_leader();
    assert_ne!(next, leader);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        store.exists(holder.key()).await.unwrap(),
        Holding::Held(Mode::Write)
    );
    assert!(
        !factory.create_lock(&r).try_acquire().await.unwrap(),
        "still held"
    );
    let _ = holder.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(PATIENCE, t).await.unwrap().unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        [0, 1, 2],
        "the queue kept its order"
    );
    drop(monitor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_minority_member_changes_nothing() {
    let cluster = EtcdCluster::start(3);
    let r = resource("minority");
    let store = store(&cluster, "?ttl=10");
    let factory = LockFactory::from_arc(store.clone());
    let holder = factory.create_lock(&r);
    holder.acquire().await.unwrap();
    let monitor = holder.keep_alive().unwrap();
    let leader = cluster.wait_leader();
    let follower = (leader + 1) % 3;
    cluster.pause(follower);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(4) {
        let other = factory.create_lock(resource("other"));
        other.acquire().await.unwrap();
        let _ = other.release().await.unwrap();
        assert!(!factory.create_lock(&r).try_acquire().await.unwrap());
    }
    cluster.resume(follower);
    assert_eq!(
        store.exists(holder.key()).await.unwrap(),
        Holding::Held(Mode::Write)
    );
    assert_eq!(holder.release().await.unwrap(), Release::Released);
    drop(monitor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_majority_gives_temporary_errors_never_a_false_conflict() {
    let cluster = EtcdCluster::start(3);
    let r = resource("majority");
    let store = store(&cluster, "?request_timeout=1");
    // The lock's ttl is its lease's.
    let factory = LockFactory::from_arc(store.clone()).with_ttl(Some(Duration::from_secs(3)));
    let free = resource("free");
    let holder = factory.create_lock(&r);
    holder.acquire().await.unwrap();
    let monitor = holder.keep_alive().unwrap();
    let leader = cluster.wait_leader();
    let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
    cluster.pause(a);
    cluster.pause(b);
    // A resource nobody holds: an error, never "held by someone else".
    for _ in 0..3 {
        let err = factory.create_lock(&free).try_acquire().await.unwrap_err();
        assert!(err.is_temporary(), "{err}");
        assert!(!err.is_conflict(), "{err}");
    }
    // The holder cannot confirm its lease for its whole ttl: it is told it lost the lock.
    let lost = tokio::time::timeout(PATIENCE, monitor.lost())
        .await
        .unwrap();
    assert_eq!(lost.reason, xtr_lock::LostReason::Expired, "{lost}");
    cluster.resume(a);
    cluster.resume(b);
    cluster.wait_leader();
    let again = factory.create_lock(&free);
    let deadline = Instant::now() + PATIENCE;
    loop {
        match again.try_acquire().await {
            Ok(true) => break,
            Ok(false) => panic!("nobody holds {free}"),
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_a_queue_mixing_etcdctl_and_ours() {
    let cluster = EtcdCluster::single();
    let r = resource("mixed");
    let store = store(&cluster, "");
    let factory = LockFactory::from_arc(store.clone());
    let first = factory.create_lock(&r);
    first.acquire().await.unwrap();
    let t1 = first.fencing_token().unwrap();
    // etcdctl queues second, ours third.
    let (mut child, revs) = etcdctl_lock(&cluster, &r, 0);
    until_queued(&store, &r, 2).await;
    let third = factory.create_lock(&r);
    let waiting = tokio::spawn({
        let third = third.clone();
        async move {
            third
                .acquire()
                .await
                .map(|()| third.fencing_token().unwrap())
        }
    });
    until_queued(&store, &r, 3).await;
    let _ = first.release().await.unwrap();
    let theirs = tokio::task::spawn_blocking(move || revs.recv_timeout(PATIENCE).unwrap())
        .await
        .unwrap();
    let t3 = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        t1 < theirs && theirs < t3,
        "{t1} < ETCD_LOCK_REV {theirs} < {t3}"
    );
    assert!(child.wait().unwrap().success());
    let _ = third.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_trusts_the_ca_it_is_given_and_nothing_else() {
    let cluster = EtcdCluster::single_tls();
    let ca = cluster.ca_file().unwrap().display().to_string();
    let trusted = EtcdStore::from_dsn(&format!("{}?ca_file={ca}", cluster.dsn(""))).unwrap();
    let lock = LockFactory::new(trusted).create_lock(resource("tls"));
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    let untrusted = EtcdStore::from_dsn(&format!(
        "{}?connect_timeout=2&request_timeout=2",
        cluster.dsn("")
    ))
    .unwrap();
    let err = LockFactory::new(untrusted)
        .create_lock(resource("tls"))
        .try_acquire()
        .await
        .unwrap_err();
    assert!(!err.is_conflict(), "{err}");
    assert!(err.is_temporary(), "{err}");
    assert!(
        format!("{err} {err:?}").contains("certificate"),
        "the refusal names the certificate: {err:?}"
    );
    let missing =
        EtcdStore::from_dsn(&format!("{}?ca_file=/nonexistent.pem", cluster.dsn(""))).unwrap();
    let err = LockFactory::new(missing)
        .create_lock("x")
        .try_acquire()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/nonexistent.pem"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_authenticates_and_a_wrong_password_is_refused_without_being_shown() {
    let cluster = EtcdCluster::single();
    cluster.etcdctl_output(&["user", "add", "root:s3cret-pw", "--interactive=false"]);
    cluster.etcdctl_output(&["auth", "enable"]);
    let dsn = |password: &str| {
        let rest = cluster.dsn("").strip_prefix("etcd://").unwrap().to_owned();
        format!("etcd://root:{password}@{rest}")
    };
    let store = EtcdStore::from_dsn(&dsn("s3cret-pw")).unwrap();
    assert!(!format!("{store} {store:?}").contains("s3cret"));
    let lock = LockFactory::new(store).create_lock(resource("auth"));
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    let wrong = EtcdStore::from_dsn(&dsn("not-the-pw")).unwrap();
    let err = LockFactory::new(wrong)
        .create_lock(resource("auth"))
        .try_acquire()
        .await
        .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains("not-the-pw"), "{text}");
    assert!(text.contains("authentication failed"), "{text}");
}

/// The holder's state is published before the grant is answered: a loss watcher made at once
/// after an acquire must wait, not report the previous hold's end as a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_watcher_made_right_after_an_acquire_waits() {
    use futures_util::FutureExt as _;
    let cluster = EtcdCluster::single();
    let store = store(&cluster, "");
    let r = resource("publish");
    let key = xtr_lock::Key::new(&r);
    for round in 0..300 {
        assert!(store.save(&key, None).await.unwrap().is_acquired());
        let watcher = store.watch_loss(&key).await.unwrap().unwrap();
        assert!(
            watcher.now_or_never().is_none(),
            "round {round}: a fresh hold was reported lost"
        );
        assert!(store.delete(&key).await.unwrap());
    }
}

/// Saves and waits dropped at every point of their way (lease grant, the queueing
/// transaction, the watch, the re-read) leave no key of theirs behind, and never a hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saves_and_waits_dropped_anywhere_leave_nothing_behind() {
    let cluster = EtcdCluster::single();
    let store = store(&cluster, "");
    let r = resource("dropped-anywhere");
    let dir = store.directory(&r);
    let holder = xtr_lock::Key::new(&r);
    assert!(store.save(&holder, None).await.unwrap().is_acquired());
    for round in 0..60u64 {
        let key = xtr_lock::Key::new(&r);
        let after = Duration::from_micros(round * 50);
        let wait = round % 2 == 0;
        let _ = tokio::time::timeout(after, async {
            if wait {
                store.wait_and_save(&key, None).await
            } else {
                store.save(&key, None).await
            }
        })
        .await;
        // Its clean-up runs in the holder's task; a later request of this key comes after it.
        assert!(!store.exists(&key).await.unwrap().is_held());
        until("only the holder's key is left", || {
            keys(&cluster, &dir).len() == 1
        })
        .await;
    }
    assert!(store.delete(&holder).await.unwrap());
    // Free now: the same drops leave no hold either (a grant nobody received is given back).
    for round in 0..40u64 {
        let key = xtr_lock::Key::new(&r);
        let _ =
            tokio::time::timeout(Duration::from_micros(round * 100), store.save(&key, None)).await;
        let _ = store.delete(&key).await;
        until("nothing is left", || keys(&cluster, &dir).is_empty()).await;
    }
}

/// A holder whose keep-alives go unanswered (the only member paused) is told it lost the lock
/// by the end of its lease, not after the request timeout (10 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_lease_is_reported_lost_at_its_end_not_after_the_request_timeout() {
    let cluster = EtcdCluster::single();
    let store = store(&cluster, "?request_timeout=10");
    let factory = LockFactory::from_arc(store.clone()).with_ttl(Some(Duration::from_secs(2)));
    let lock = factory.create_lock(resource("unconfirmed"));
    lock.acquire().await.unwrap();
    let monitor = lock.keep_alive().unwrap();
    let left = store.lease_remaining(lock.key()).unwrap();
    cluster.pause(0);
    let paused = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(30), monitor.lost())
        .await
        .expect("the loss is reported");
    let after = paused.elapsed();
    cluster.resume(0);
    assert_eq!(lost.reason, xtr_lock::LostReason::Expired, "{lost}");
    assert!(
        after < left + Duration::from_secs(1),
        "told {after:?} after the pause, the lease was confirmed for {left:?}"
    );
}
