//! A Redis Cluster losing a master under contention: with `wait_replicas=1`, tasks here and in
//! a second process never hold a resource together and its fencing tokens keep increasing
//! while the master serving it is killed and its replica promoted; without it, a holder whose
//! lock never reached the replica is told by its next renewal that it lost it. The contention
//! loop is shared with the resharding test (`redis_cluster`).

use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xtr_lock::{LockFactory, Lockable as _, LostReason, RedisStore, Release};
use xtr_lock_testkit::redis_cluster::RedisCluster;

use crate::support::sections::Sections;

/// The environment variable that tells the second process what to contend for.
const CHILD_VAR: &str = "XTR_LOCK_CLUSTER_CONTENDER";

/// What the contenders of one process saw.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) sections: AtomicUsize,
    pub(crate) errors: AtomicUsize,
    /// Releases that found the lock gone before its lease could have ended.
    pub(crate) lost: AtomicUsize,
    /// Releases that found it gone after its lease ended (a release held up by an outage).
    pub(crate) expired: AtomicUsize,
    /// When each section ended.
    pub(crate) ends: Mutex<Vec<Instant>>,
    /// When each error came, and what it said.
    pub(crate) failures: Mutex<Vec<(Instant, String)>>,
}

impl Tally {
    fn failed(&self, err: &xtr_lock::Error) {
        self.errors.fetch_add(1, Ordering::SeqCst);
        self.failures
            .lock()
            .unwrap()
            .push((Instant::now(), format!("{err:?}")));
    }

    /// The longest time without a section ending, from `since` on: how long locks did not
    /// work.
    pub(crate) fn longest_pause_after(&self, since: Instant) -> Duration {
        let mut ends: Vec<Instant> = self.ends.lock().unwrap().clone();
        ends.sort();
        let mut last = since;
        let mut longest = Duration::ZERO;
        for end in ends.into_iter().filter(|&end| end > since) {
            longest = longest.max(end - last);
            last = end;
        }
        longest
    }
}

/// One contender: until `stop` holds, takes one of `resources` at random (ttl `ttl`, giving up
/// on an error, which `tally` counts), enters its checked section for 5 ms and releases. A wait
/// longer than `stuck` fails the test: a waiter nobody wakes.
pub(crate) async fn contend(
    factory: LockFactory,
    resources: Vec<String>,
    sections: Sections,
    who: String,
    tally: Arc<Tally>,
    stop: impl Fn() -> bool,
    stuck: Duration,
) {
    while !stop() {
        let resource = &resources[rand::random::<u32>() as usize % resources.len()];
        let lock = factory.create_lock(resource.clone());
        match tokio::time::timeout(stuck, lock.acquire()).await {
            Err(_) => panic!("{who} waited over {stuck:?} for {resource:?}"),
            Ok(Err(err)) => {
                tally.failed(&err);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Ok(Ok(())) => {}
        }
        let token = lock.fencing_token().expect("Redis fences");
        // Never later than the server's end of the lease.
        let lease_end = lock.remaining_lifetime().map(|left| Instant::now() + left);
        let section = sections.enter(resource, token, &who);
        tokio::time::sleep(Duration::from_millis(5)).await;
        section.leave();
        tally.sections.fetch_add(1, Ordering::SeqCst);
        tally.ends.lock().unwrap().push(Instant::now());
        match lock.release().await {
            Ok(Release::Released) => {}
            Ok(Release::Lost) if lease_end.is_some_and(|end| Instant::now() < end) => {
                tally.lost.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Release::Lost) => {
                tally.expired.fetch_add(1, Ordering::SeqCst);
            }
            Ok(other) => panic!("{who}: release of a held lock said {other:?}"),
            Err(err) => tally.failed(&err),
        }
    }
}

/// `count` resource names whose keys all live on the master that serves the first.
pub(crate) fn on_one_master(cluster: &RedisCluster, base: &str, count: usize) -> Vec<String> {
    let master = |name: &str| cluster.master_of_slot(RedisCluster::slot_of(name.as_bytes()));
    let first = format!("{base}-0");
    let home = master(&first);
    let mut names = vec![first];
    for i in 1.. {
        if names.len() == count {
            break;
        }
        let name = format!("{base}-{i}");
        if master(&name) == home {
            names.push(name);
        }
    }
    names
}

/// The second process: contends with two tasks until the test creates `stop` in the shared
/// directory, then prints its tally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by cluster_fail_over_under_contention_never_overlaps_nor_goes_back"]
async fn cluster_contender_child() {
    let spec = std::env::var(CHILD_VAR).expect("started by the parent test");
    let mut parts = spec.split('\n');
    let (dsn, dir) = (parts.next().unwrap(), parts.next().unwrap());
    let resources: Vec<String> = parts.next().unwrap().split(',').map(Into::into).collect();
    let factory =
        LockFactory::new(RedisStore::from_dsn(dsn).unwrap()).with_ttl(Some(Duration::from_secs(2)));
    let (sections, tally) = (Sections::new(Path::new(dir)), Arc::new(Tally::default()));
    let stop_file = Path::new(dir).join("stop");
    let tasks: Vec<_> = (0..2)
        .map(|i| {
            let stop_file = stop_file.clone();
            tokio::spawn(contend(
                factory.clone(),
                resources.clone(),
                sections.clone(),
                format!("child-{i}"),
                tally.clone(),
                move || stop_file.exists(),
                Duration::from_secs(20),
            ))
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    println!(
        "DONE sections={} errors={} lost={} expired={}",
        tally.sections.load(Ordering::SeqCst),
        tally.errors.load(Ordering::SeqCst),
        tally.lost.load(Ordering::SeqCst),
        tally.expired.load(Ordering::SeqCst)
    );
}

fn start_child(dsn: &str, dir: &Path, resources: &[String]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "redis_cluster_faults::cluster_contender_child",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(
            CHILD_VAR,
            format!("{dsn}\n{}\n{}", dir.display(), resources.join(",")),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (bounded) until `n` sections ended in this process.
async fn until_sections(tally: &Tally, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tally.sections.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < deadline, "fewer than {n} sections in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_fail_over_under_contention_never_overlaps_nor_goes_back() {
    let cluster = RedisCluster::start(3, 1);
    let dsn = format!("{}?wait_replicas=1&wait_timeout=0.5", cluster.dsn());
    let resources = on_one_master(&cluster, "failover", 3);
    let master = cluster.master_of_slot(RedisCluster::slot_of(resources[0].as_bytes()));
    let cluster = fail_over_under_contention(&dsn, &resources, move || {
        let mut cluster = cluster;
        // The promoted replica has no replica of its own: the old master comes back as one,
        // or no save could be confirmed by `WAIT 1` again.
        let new = cluster.failover_by_killing(master);
        let promoted = Instant::now();
        cluster.restart(master);
        assert_eq!(cluster.replicas_of(new), vec![master]);
        (
            cluster,
            format!("master {master} killed, replica {new} promoted at {promoted:?}"),
        )
    })
    .await;
    drop(cluster);
}

/// Four tasks here and two in a second process contend for `resources` on `dsn` (which asks
/// for `wait_replicas`), in checked sections; after 30 sections `kill` (run on a blocking
/// thread) kills the master and brings the deployment back, saying what it did; then 30 more
/// (100 in all at least). No two holders at once, tokens never back, no confirmed lock lost.
/// Returns what `kill` returned, to be dropped by the caller.
pub(crate) async fn fail_over_under_contention<T: Send + 'static>(
    dsn: &str,
    resources: &[String],
    kill: impl FnOnce() -> (T, String) + Send + 'static,
) -> T {
    let began = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let sections = Sections::new(dir.path());
    let mut child = start_child(dsn, dir.path(), resources);
    let factory =
        LockFactory::new(RedisStore::from_dsn(dsn).unwrap()).with_ttl(Some(Duration::from_secs(2)));
    let tally = Arc::new(Tally::default());
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let done = done.clone();
            tokio::spawn(contend(
                factory.clone(),
                resources.to_vec(),
                sections.clone(),
                format!("parent-{i}"),
                tally.clone(),
                move || done.load(Ordering::SeqCst),
                Duration::from_secs(20),
            ))
        })
        .collect();
    until_sections(&tally, 30).await;
    let killed = Instant::now();
    let (deployment, what) = tokio::task::spawn_blocking(kill).await.unwrap();
    let back_after = killed.elapsed();
    let before = tally.sections.load(Ordering::SeqCst);
    until_sections(&tally, before.max(70) + 30).await;
    std::fs::write(dir.path().join("stop"), "").unwrap();
    done.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let status = child.wait().unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(status.success(), "the second process failed: {out}");
    let child_line = out.lines().find(|l| l.starts_with("DONE")).unwrap_or("");
    let total: usize = resources.iter().map(|r| sections.check_tokens(r)).sum();
    let by_child = resources
        .iter()
        .flat_map(|r| sections.tokens(r))
        .filter(|(_, who)| who.starts_with("child"))
        .count();
    let errors = tally.errors.load(Ordering::SeqCst);
    eprintln!(
        "{total} sections ({by_child} by the second process: {child_line}); {what}, all back \
         after {back_after:?}; {errors} errors here; no section ended for {:?} after the \
         kill; lost {}, expired during the outage {}; test took {:?}",
        tally.longest_pause_after(killed),
        tally.lost.load(Ordering::SeqCst),
        tally.expired.load(Ordering::SeqCst),
        began.elapsed()
    );
    for (at, err) in tally.failures.lock().unwrap().iter().take(5) {
        eprintln!(
            "  {:?} after the kill: {err}",
            at.saturating_duration_since(killed)
        );
    }
    assert!(total >= 100, "{total} sections");
    assert!(by_child > 0, "the second process held too");
    assert!(
        child_line.contains(" lost=0 "),
        "a confirmed lock was lost in the second process: {child_line}"
    );
    assert_eq!(
        tally.lost.load(Ordering::SeqCst),
        0,
        "a confirmed lock was lost"
    );
    deployment
}

/// Makes `replica` unable to follow its master from now on: its replication link is cut and
/// it can no longer authenticate to reconnect (`masterauth` to a master without a password).
/// What the master writes next never reaches it, as if it were cut off by the network.
pub(crate) fn cut_off(cli: impl Fn(u16, &[&str]) -> String, master: u16, replica: u16) {
    assert_eq!(cli(replica, &["CONFIG", "SET", "masterauth", "nope"]), "OK");
    cli(master, &["CLIENT", "KILL", "TYPE", "replica"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cli(replica, &["INFO", "replication"]).contains("master_link_status:down") {
        assert!(Instant::now() < deadline, "the replica's link is still up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_promoted_replica_never_had_is_reported_lost_by_the_next_renewal() {
    let began = Instant::now();
    let cluster = RedisCluster::start(3, 1);
    let store = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let resource = on_one_master(&cluster, "unreplicated", 1).remove(0);
    let master = cluster.master_of_slot(RedisCluster::slot_of(resource.as_bytes()));
    let replica = cluster.replicas_of(master)[0];
    let cut = tokio::task::spawn_blocking(move || {
        cut_off(|p, a| cluster.cli(p, a), master, replica);
        cluster
    });
    let mut cluster = cut.await.unwrap();
    let ttl = Duration::from_secs(10);
    let holder = LockFactory::new(store.clone())
        .create_lock(resource.clone())
        .with_ttl(Some(ttl));
    holder.acquire().await.unwrap();
    let acquired = Instant::now();
    let watch = holder.keep_alive().unwrap();
    assert_eq!(
        cluster.cli(replica, &["DBSIZE"]),
        "0",
        "the replica has nothing"
    );
    let failover = tokio::task::spawn_blocking(move || {
        let new = cluster.failover_by_killing(master);
        (cluster, new)
    });
    let (cluster, new) = failover.await.unwrap();
    let promoted = acquired.elapsed();
    let lost = tokio::time::timeout(ttl, watch.lost())
        .await
        .expect("the loss is reported");
    let told = acquired.elapsed();
    eprintln!(
        "promoted {new} {promoted:?} after the acquire, loss ({}) told after {told:?}; test \
         took {:?}",
        lost.reason,
        began.elapsed()
    );
    assert_ne!(
        lost.reason,
        LostReason::Expired,
        "found missing, not run out"
    );
    assert!(
        told < ttl,
        "told by a renewal before the lease ran out: {told:?}"
    );
    assert_eq!(holder.release().await.unwrap(), Release::Lost);
    let next = LockFactory::new(store)
        .create_lock(resource)
        .with_ttl(Some(ttl));
    assert!(
        next.try_acquire().await.unwrap(),
        "the new master takes locks"
    );
    drop(cluster);
}
