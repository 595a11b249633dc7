//! The etcd store against the floor (one `Put` and one linearizable `Get` round trip on the
//! same client library) and against `etcdctl lock`, on a throwaway single member and a
//! 3-member cluster, side by side in interleaved rounds: uncontended acquire + release,
//! hand-off, and a 100-waiter FIFO pass-through with the requests the cluster served per
//! hand-off (from its own `grpc_server_handled_total`); and a semaphore's cycle (one permit of
//! limit 4, the three others held) in the same rounds.
//!
//! `cargo run --release -p xtr-lock-bench --bin etcd-bench` prints a Markdown table; run it
//! under `taskset -c 0` too for the other placement (everything on one vCPU).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use xtr_lock::{EtcdStore, LockFactory, Lockable as _, Semaphore};
use xtr_lock_bench::{Summary, cell, handoffs_between, human};
use xtr_lock_testkit::etcd::EtcdCluster;

const ROUNDS: usize = 3;
const CYCLES: usize = 200;
const HANDOFFS: usize = 20;
const ETCDCTL: usize = 10;
const QUEUE: usize = 100;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("| what | 1 member | ÷ Put | 3 members | ÷ Put |\n|---|---|---|---|---|");
    let one = EtcdCluster::single();
    let three = EtcdCluster::start(3);
    let a = rt.block_on(measure(&one));
    let b = rt.block_on(measure(&three));
    let row = |what: &str, x: &Summary, y: &Summary, a_put: &Summary, b_put: &Summary| {
        println!(
            "| {what} | {} | {:.2}× | {} | {:.2}× |",
            cell(x),
            ratio(x.p50, a_put.p50),
            cell(y),
            ratio(y.p50, b_put.p50)
        );
    };
    row(
        "floor: one `Put`, p50 (p99)",
        &a.put,
        &b.put,
        &a.put,
        &b.put,
    );
    row(
        "floor: one linearizable `Get`",
        &a.get,
        &b.get,
        &a.put,
        &b.put,
    );
    row(
        "xtr-lock: acquire + release",
        &a.cycle,
        &b.cycle,
        &a.put,
        &b.put,
    );
    row(
        "xtr-lock semaphore: acquire + release (limit 4, 3 held)",
        &a.sem_cycle,
        &b.sem_cycle,
        &a.put,
        &b.put,
    );
    row(
        "xtr-lock: hand-off (release → the waiter holds)",
        &a.handoff,
        &b.handoff,
        &a.put,
        &b.put,
    );
    row(
        "xtr-lock: 100-waiter pass-through, per hand-off",
        &a.passthrough,
        &b.passthrough,
        &a.put,
        &b.put,
    );
    row(
        "`etcdctl lock NAME -- true` (a process each)",
        &a.etcdctl,
        &b.etcdctl,
        &a.put,
        &b.put,
    );
    println!(
        "| requests the cluster served per hand-off in the 100-waiter queue | {:.1} | | {:.1} | |",
        a.requests_per_handoff, b.requests_per_handoff
    );
    eprintln!(
        "Put p50: 1 member {}, 3 members {}",
        human(a.put.p50),
        human(b.put.p50)
    );
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

struct Measured {
    put: Summary,
    get: Summary,
    cycle: Summary,
    sem_cycle: Summary,
    handoff: Summary,
    passthrough: Summary,
    etcdctl: Summary,
    requests_per_handoff: f64,
}

async fn measure(cluster: &EtcdCluster) -> Measured {
    eprintln!("{} member(s)", cluster.len());
    let endpoints = cluster.endpoints();
    let mut client = Client::connect(&endpoints, None).await.unwrap();
    let dsn = cluster.dsn("");
    let factory = LockFactory::new(EtcdStore::from_dsn(&dsn).unwrap());
    let other = LockFactory::new(EtcdStore::from_dsn(&dsn).unwrap());
    let lock = factory.create_lock("bench:cycle");
    for _ in 0..50 {
        assert!(lock.try_acquire().await.unwrap());
        let _ = lock.release().await.unwrap();
        client.put("bench:floor", "x", None).await.unwrap();
    }
    let (mut put, mut get, mut cycle, mut handoff, mut pass, mut ctl) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (semaphore, others) = semaphores(&other).await;
    let mut sem_cycle = Vec::new();
    let mut requests = Vec::new();
    for round in 0..ROUNDS {
        eprintln!("  round {}/{ROUNDS}", round + 1);
        for _ in 0..CYCLES {
            let t = Instant::now();
            assert!(lock.try_acquire().await.unwrap());
            let _ = lock.release().await.unwrap();
            cycle.push(t.elapsed());
            let t = Instant::now();
            assert!(semaphore.try_acquire().await.unwrap());
            let _ = semaphore.release().await.unwrap();
            sem_cycle.push(t.elapsed());
            let t = Instant::now();
            client.put("bench:floor", "x", None).await.unwrap();
            put.push(t.elapsed());
            let t = Instant::now();
            client
                .get("bench:floor", Some(GetOptions::new()))
                .await
                .unwrap();
            get.push(t.elapsed());
        }
        handoff.extend(handoffs_between(&factory, &other, "bench:handoff", HANDOFFS).await);
        let (per, served) = passthrough(cluster, &factory, round).await;
        pass.push(per);
        requests.push(served);
        ctl.extend(etcdctl_cycles(cluster, ETCDCTL).await);
    }
    for s in others {
        let _ = s.release().await.unwrap();
    }
    Measured {
        put: Summary::of(put),
        get: Summary::of(get),
        cycle: Summary::of(cycle),
        sem_cycle: Summary::of(sem_cycle),
        handoff: Summary::of(handoff),
        passthrough: Summary::of(pass),
        etcdctl: Summary::of(ctl),
        requests_per_handoff: requests.iter().sum::<f64>() / requests.len() as f64,
    }
}

/// A semaphore of limit 4 with three permits held (on `factory`), and the holder to cycle.
async fn semaphores(factory: &LockFactory) -> (Semaphore, Vec<Semaphore>) {
    let mut held = Vec::new();
    for _ in 0..3 {
        let s = factory.create_semaphore("bench:semaphore", 4).unwrap();
        assert!(s.try_acquire().await.unwrap());
        held.push(s);
    }
    let s = factory.create_semaphore("bench:semaphore", 4).unwrap();
    for _ in 0..20 {
        assert!(s.try_acquire().await.unwrap());
        let _ = s.release().await.unwrap();
    }
    (s, held)
}

/// 100 waiters queued behind a holder, each releasing as soon as it holds: the time per
/// hand-off once the holder lets go, and the requests the cluster served per hand-off.
async fn passthrough(
    cluster: &EtcdCluster,
    factory: &LockFactory,
    round: usize,
) -> (Duration, f64) {
    let resource = format!("bench:queue:{round}");
    let holder = factory.create_lock(&resource);
    holder.acquire().await.unwrap();
    let store = factory.store().clone();
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..QUEUE {
        let lock = factory.create_lock(&resource);
        let served = served.clone();
        tasks.push(tokio::spawn(async move {
            lock.acquire().await.unwrap();
            served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = lock.release().await.unwrap();
        }));
    }
    while store.holders(&resource).await.unwrap().len() < QUEUE + 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = handled(cluster);
    let t = Instant::now();
    let _ = holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let per = t.elapsed() / QUEUE as u32;
    let after = handled(cluster);
    (per, (after - before) as f64 / QUEUE as f64)
}

/// The requests every member has served (`grpc_server_handled_total`, every method), and the
/// watch and keep-alive streams they opened.
fn handled(cluster: &EtcdCluster) -> u64 {
    cluster
        .endpoints()
        .iter()
        .map(|e| {
            let mut s = TcpStream::connect(e.as_str()).unwrap();
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            text.lines()
                .filter(|l| {
                    l.starts_with("grpc_server_handled_total{")
                        || l.starts_with("grpc_server_msg_received_total{")
                            && l.contains("grpc_type=\"bidi_stream\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        })
        .sum()
}

/// `etcdctl lock NAME -- true`, a process each: what a shell script pays per lock today.
async fn etcdctl_cycles(cluster: &EtcdCluster, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut cmd = cluster.etcdctl();
        cmd.args(["lock", "bench:etcdctl", "--", "true"]);
        let t = Instant::now();
        let status = tokio::task::spawn_blocking(move || cmd.status().unwrap())
            .await
            .unwrap();
        assert!(status.success());
        out.push(t.elapsed());
    }
    out
}
