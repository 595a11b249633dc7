//! The etcd store's elections, metadata and listing against `etcdctl elect` (Go's
//! `concurrency.Election`, the same layout as `etcdctl lock`): ours leads and `etcdctl elect`
//! waits while `etcdctl elect -l` prints our value; `etcdctl elect` leads and ours waits, sees
//! its proposal, and leads once it resigns. Records never sit where a peer looks.

use std::process::Child;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use xtr_lock::{LockFactory, Lockable as _, Store as _};
use xtr_lock_testkit::etcd::EtcdCluster;

use super::etcd::{keys, resource, spawn_lines, store};

const PATIENCE: Duration = Duration::from_secs(20);

/// `etcdctl elect [args]`, its output lines on a channel.
fn etcdctl_elect(cluster: &EtcdCluster, args: &[&str]) -> (Child, Receiver<String>) {
    let mut cmd = cluster.etcdctl();
    cmd.arg("elect").args(args);
    spawn_lines(&mut cmd, Some)
}

/// Waits (off the runtime) until `rx` gives the line `want`.
async fn until_line(rx: Receiver<String>, want: &str) -> Receiver<String> {
    let want = want.to_owned();
    tokio::task::spawn_blocking(move || {
        loop {
            match rx.recv_timeout(PATIENCE) {
                Ok(line) if line == want => return rx,
                Ok(_) => {}
                Err(e) => panic!("etcdctl never printed {want:?}: {e}"),
            }
        }
    })
    .await
    .unwrap()
}

/// SIGINT: `etcdctl elect` resigns (deletes its key) and exits.
fn interrupt(child: &mut Child) {
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_leads_etcdctl_elect_waits_and_its_observer_prints_our_value() {
    let cluster = EtcdCluster::single();
    let name = resource("elect");
    let factory = LockFactory::from_arc(store(&cluster, ""));
    let ours = factory.create_election(&name);
    let leadership = ours.campaign("ours-P0").await.unwrap();

    let (mut observer, seen) = etcdctl_elect(&cluster, &["-l", &name]);
    let seen = until_line(seen, "ours-P0").await;
    let (mut theirs, out) = etcdctl_elect(&cluster, &[&name, "P2"]);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        out.try_iter().all(|l| l != "P2"),
        "etcdctl elect must not lead while ours does"
    );
    // Our records are outside the election's directory: etcdctl sees two candidates.
    assert_eq!(keys(&cluster, &format!("{name}/")).len(), 2);
    let leader = ours.leader().await.unwrap().expect("ours leads");
    assert_eq!(leader.value.as_deref(), Some(&b"ours-P0"[..]));
    assert_eq!(leader.term, leadership.term());

    let _ = ours.resign().await.unwrap();
    let _out = until_line(out, "P2").await;
    let _seen = until_line(seen, "P2").await;
    let leader = ours.leader().await.unwrap().expect("etcdctl leads");
    assert_eq!(leader.value.as_deref(), Some(&b"P2"[..]));
    assert!(leader.term > leadership.term(), "{leader:?}");
    interrupt(&mut theirs);
    let _ = observer.kill();
    let _ = observer.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_leads_ours_waits_observes_it_and_leads_after_it_resigns() {
    let cluster = EtcdCluster::single();
    let name = resource("elect");
    let factory = LockFactory::from_arc(store(&cluster, ""));
    let (mut theirs, out) = etcdctl_elect(&cluster, &[&name, "P1"]);
    let _out = until_line(out, "P1").await;

    let ours = factory.create_election(&name);
    let leader = ours.leader().await.unwrap().expect("etcdctl leads");
    assert_eq!(leader.value.as_deref(), Some(&b"P1"[..]));
    let mut observer = ours.observe();
    let first = observer.next().await.unwrap().expect("etcdctl leads");
    assert_eq!(first.value.as_deref(), Some(&b"P1"[..]));
    // The list shows etcdctl's election as a lock held by a writer whose metadata is P1.
    let listed = factory.store().list(&name).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].holders[0].meta.as_deref(), Some(&b"P1"[..]));

    let campaign = {
        let ours = ours.clone();
        tokio::spawn(async move { ours.campaign("ours-P3").await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !campaign.is_finished(),
        "ours must wait while etcdctl leads"
    );
    interrupt(&mut theirs);
    let leadership = tokio::time::timeout(PATIENCE, campaign)
        .await
        .expect("ours leads once etcdctl resigned")
        .unwrap()
        .unwrap();
    let next = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(l) = observer.next().await.unwrap()
                && l.value.as_deref() == Some(&b"ours-P3"[..])
            {
                return l;
            }
        }
    })
    .await
    .expect("the observer sees ours lead");
    assert_eq!(next.term, leadership.term());
    assert!(next.term > first.term, "{next:?} after {first:?}");
    let _ = ours.resign().await.unwrap();
    // Nothing of ours is left: no queue key, no record.
    assert!(keys(&cluster, &format!("{name}/")).is_empty());
    assert!(keys(&cluster, &format!("xtr-meta/{name}/")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_named_read_is_refused_and_records_go_with_their_keys() {
    let cluster = EtcdCluster::single();
    let name = resource("meta");
    let factory = LockFactory::from_arc(store(&cluster, ""));
    let lock = factory.create_lock(&name).with_meta("read").unwrap();
    let err = lock.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), xtr_lock::ErrorKind::InvalidArgument, "{err}");
    assert!(keys(&cluster, &format!("{name}/")).is_empty());

    // A DSN-looking value is stored verbatim (the CLI never puts one there).
    let dsn = "postgres://user:pw@db/app";
    let lock = factory.create_lock(&name).with_meta(dsn).unwrap();
    assert!(lock.try_acquire().await.unwrap());
    let holders = factory.store().holders(&name).await.unwrap();
    assert_eq!(holders[0].meta.as_deref(), Some(dsn.as_bytes()));
    assert_eq!(keys(&cluster, &format!("xtr-meta/{name}/")).len(), 1);
    let _ = lock.release().await.unwrap();
    assert!(keys(&cluster, &format!("xtr-meta/{name}/")).is_empty());
}
