//! The etcd store while one member of three is paused (SIGSTOP: its sockets stay open, it
//! answers nothing): every operation goes on through the other two, none fails, and none
//! waits for the paused member longer than it takes to find it silent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xtr_lock::{EtcdStore, LockFactory, Lockable as _, Release};
use xtr_lock_testkit::etcd::EtcdCluster;

/// How many tasks acquire, try and release at once: enough that requests are always in flight
/// when the member stops, and that many of them pick it afterwards.
const WORKERS: usize = 8;
/// How long the member stays paused.
const PAUSED: Duration = Duration::from_secs(8);
/// How long the client's HTTP/2 keep-alive takes to find a silent connection (a ping a
/// second, a second to answer it).
const KEEP_ALIVE_FINDS: Duration = Duration::from_secs(2);
/// By when, after the pause, the store has found the member silent (the keep-alive's time,
/// with a margin for a loaded machine).
const FOUND_SILENT: Duration = Duration::from_secs(4);

fn resource(name: &str) -> String {
    format!("{name}-{:08x}", rand::random::<u32>())
}

/// `err` with its causes.
fn chain(err: &dyn std::error::Error) -> String {
    let mut said = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        said = format!("{said}: {c}");
        cause = c.source();
    }
    said
}

/// What the workers saw: each operation's duration, with when it started, and each error.
#[derive(Default)]
struct Seen {
    took: Vec<(Instant, Duration)>,
    errors: Vec<String>,
}

/// One worker: acquire its own resource, try the held one (refused), release its own, until
/// `until`.
async fn work(factory: LockFactory, held: String, until: Instant, seen: Arc<Mutex<Seen>>) {
    let own = resource("paused-own");
    while Instant::now() < until {
        let started = Instant::now();
        let lock = factory.create_lock(&own);
        let outcome = async {
            lock.acquire()
                .await
                .map_err(|e| format!("acquire: {}", chain(&e)))?;
            if factory
                .create_lock(&held)
                .try_acquire()
                .await
                .map_err(|e| format!("try_acquire: {}", chain(&e)))?
            {
                return Err(format!("{held} is held, and was granted again"));
            }
            match lock.release().await {
                Ok(Release::Released) => Ok(()),
                Ok(other) => Err(format!("release: {other:?}")),
                Err(e) => Err(format!("release: {}", chain(&e))),
            }
        }
        .await;
        let mut seen = seen.lock().unwrap();
        seen.took.push((started, started.elapsed()));
        if let Err(e) = outcome {
            seen.errors.push(e);
        }
    }
}

/// Requests are in flight when a follower stops, and many more are made while it stays
/// stopped. The client balances over the three members: whatever it sent to the stopped one
/// waits until the connection is found silent, and no operation may fail for it. Once the
/// store has found the member silent, it sends it nothing more: the operations after that
/// take no longer than a request to a live member. The holder's monitor (keep-alives, its
/// loss watch, its look for a revocation notice) runs all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_member_fails_no_operation_and_stalls_only_those_in_flight() {
    let cluster = EtcdCluster::start(3);
    let store = Arc::new(EtcdStore::from_dsn(&format!("{}?ttl=10", cluster.dsn(""))).unwrap());
    let factory = LockFactory::from_arc(store.clone());
    let held = resource("paused-held");
    let holder = factory.create_lock(&held);
    holder.acquire().await.unwrap();
    let monitor = holder.keep_alive().unwrap();
    let follower = (cluster.wait_leader() + 1) % 3;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let warm_up = Duration::from_secs(1);
    let paused_at = Instant::now() + warm_up;
    let until = paused_at + PAUSED;
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| tokio::spawn(work(factory.clone(), held.clone(), until, seen.clone())))
        .collect();
    tokio::time::sleep(warm_up).await;
    cluster.pause(follower);
    for w in workers {
        w.await.unwrap();
    }
    cluster.resume(follower);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let slow: Vec<_> = seen
        .took
        .iter()
        .filter(|(_, took)| *took > Duration::from_secs(1))
        .map(|(at, took)| (at.saturating_duration_since(paused_at), *took))
        .collect();
    eprintln!(
        "{} operations, {} errors; slower than 1 s (started after the pause, took): {slow:?}",
        seen.took.len(),
        seen.errors.len()
    );
    assert!(seen.errors.is_empty(), "{:#?}", seen.errors);
    assert!(
        seen.took.len() > WORKERS * 4,
        "{} operations",
        seen.took.len()
    );
    // What went to the stopped member waited for the keep-alive to find it silent (two
    // seconds): only operations begun before that may have.
    let stalled_later: Vec<_> = slow
        .iter()
        .filter(|(at, took)| *at > FOUND_SILENT && *took >= KEEP_ALIVE_FINDS)
        .collect();
    assert!(stalled_later.is_empty(), "{stalled_later:?}");
    assert_eq!(holder.release().await.unwrap(), Release::Released);
    drop(monitor);
}
