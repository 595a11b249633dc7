//! Waiting at scale on Redis, side by side in one run on one throwaway redis-server: what a
//! blocking acquire of a free lock costs against `try_acquire`, what parked waiters send, how
//! many scripts a hand-off takes with its waiters in one process or ten, a hand-off across
//! processes against an uncontended cycle after the same idle time, the CPU of 1,000 and 10,000
//! parked waiters, and bytes per held lock (against Python xtr-lock 4.1.0 where it has the row).
//!
//! Latency rows are measured twice, with the client pinned (`taskset`) to the server's vCPU and
//! to the other one: on this kind of VM the placement alone moves a loopback round trip between
//! about 7 and 65 µs.
//!
//! `cargo run --release -p xtr-lock-bench --bin waiting-bench` prints Markdown tables.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use xtr_lock::{InMemoryStore, Lock, LockFactory, Lockable as _, RedisStore};
use xtr_lock_bench::{Summary, cell, human, monotonic_ns, park, peer_script};
use xtr_lock_testkit::redis::RedisServer;

/// Counts the bytes this process holds on the heap.
#[global_allocator]
static ALLOCATOR: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// Heap bytes in use now.
fn live_bytes() -> isize {
    let stats = ALLOCATOR.stats();
    stats.bytes_allocated as isize - stats.bytes_deallocated as isize + stats.bytes_reallocated
}

const TTL: Duration = Duration::from_secs(60);
const ROUNDS: usize = 20;
const PER_ROUND: usize = 250;
const HANDOFFS: usize = 60;
const PARKED_FOR: Duration = Duration::from_secs(3);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(&args[2..]);
    }
    let server = RedisServer::start();
    let dsn = server.url(0);
    let server_pid = info_field(&server, "server", "process_id");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = RedisStore::from_dsn(&dsn).unwrap();
    // Memory first, while nothing else this process did is still being freed in the background
    // (the clean-ups of the parked waiters below).
    let mem_rust = rt.block_on(bytes_per_lock(LockFactory::new(InMemoryStore::new())));
    let mem_py = python_memory("in-memory");
    let redis_rust = rt.block_on(bytes_per_lock(LockFactory::new(store.clone())));
    let redis_py = python_memory(&dsn);

    println!(
        "| placement | `try_acquire`, free fresh resource | `acquire` (blocking) | ratio of p50s | p99 / p50: try, acquire | `acquire`: every 65th call, max |"
    );
    println!("|---|---|---|---|---|---|");
    let mut handoff_rows = Vec::new();
    for (placement, cpu) in [
        ("client on the server's vCPU", 0),
        ("client on the other vCPU", 1),
    ] {
        pin(&server_pid, 0);
        pin(&std::process::id().to_string(), cpu);
        let (tries, acquires, every_65th) = rt.block_on(free_lock(&store));
        println!(
            "| {placement} | {} | {} | {:.3} | {:.2}, {:.2} | {}, {} |",
            cell(&tries),
            cell(&acquires),
            ratio(acquires.p50, tries.p50),
            ratio(tries.p99, tries.p50),
            ratio(acquires.p99, acquires.p50),
            cell(&every_65th),
            human(acquires.max),
        );
        let (handoff, idle) = rt.block_on(handoffs_across(&store, &dsn, cpu));
        handoff_rows.push((placement, handoff, idle));
    }
    pin(&std::process::id().to_string(), -1);
    pin(&server_pid, -1);

    println!();
    println!(
        "| placement (all processes) | hand-off across processes | uncontended cycle after the same idle time | ratio of p50s |"
    );
    println!("|---|---|---|---|");
    for (placement, handoff, idle) in &handoff_rows {
        println!(
            "| {placement} | {} | {} | {:.2} |",
            cell(handoff),
            cell(idle),
            ratio(handoff.p50, idle.p50)
        );
    }

    println!();
    println!("| parked waiters, 100 on one resource | Redis commands / s / waiter |");
    println!("|---|---|");
    let ours = rt.block_on(parked_behind_ours(&server, &store));
    println!("| xtr-lock waiters, xtr-lock holder | {ours:.3} |");
    let beside_py = rt.block_on(parked_behind_python(&server, &store, &dsn));
    println!("| xtr-lock waiters, Python holder | {beside_py:.2} |");
    let py = python_waiters(&server, &dsn);
    println!("| Python xtr-lock 4.1.0 waiters, xtr-lock holder | {py:.2} |");

    println!();
    println!(
        "| 100 waiters, hand-offs until all held | scripts / hand-off | commands / hand-off |"
    );
    println!("|---|---|---|");
    let (s, c) = rt.block_on(chain_in_process(&server, &store));
    println!("| 1 process × 100 waiters | {s:.2} | {c:.2} |");
    let (s, c) = rt.block_on(chain_in_processes(&server, &store, &dsn));
    println!("| 10 processes × 10 waiters | {s:.2} | {c:.2} |");

    println!();
    println!("| parked waiters | server CPU | waiting process CPU |");
    println!("|---|---|---|");
    for n in [1_000, 10_000] {
        let (server_cpu, client_cpu) = rt.block_on(parked_cpu(&server, &store, n));
        println!(
            "| {n} | {:.2} % | {:.2} % |",
            server_cpu * 100.0,
            client_cpu * 100.0
        );
    }

    println!();
    println!("| bytes per held lock (10,000 held) | xtr-lock (Rust) | Python xtr-lock 4.1.0 |");
    println!("|---|---|---|");
    println!("| in-memory store | {mem_rust:.0} | {mem_py:.0} |");
    println!("| Redis store | {redis_rust:.0} | {redis_py:.0} |");
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// `taskset` on every thread of `pid`: one vCPU, or both (`-1`).
fn pin(pid: &str, cpu: i32) {
    let cpus = if cpu < 0 {
        "0,1".to_owned()
    } else {
        cpu.to_string()
    };
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", &cpus, pid])
        .stdout(Stdio::null())
        .status()
        .expect("taskset (util-linux) is needed to pin processes");
    assert!(status.success(), "taskset failed for {pid}");
}

fn info_field(server: &RedisServer, section: &str, field: &str) -> String {
    server
        .cli(&["INFO", section])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
        .trim()
        .to_owned()
}

/// Commands clients sent since the server started (scripts count as one).
fn commands(server: &RedisServer) -> f64 {
    info_field(server, "stats", "total_commands_processed")
        .parse()
        .unwrap()
}

fn server_cpu(server: &RedisServer) -> f64 {
    let f = |name| info_field(server, "cpu", name).parse::<f64>().unwrap();
    f("used_cpu_sys") + f("used_cpu_user")
}

fn own_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

fn queued(store: &RedisStore, dsn: &str, resource: &str) -> usize {
    let mut conn = redis::Client::open(dsn).unwrap().get_connection().unwrap();
    redis::cmd("ZCARD")
        .arg(store.internal_key(&format!("queue:{resource}")))
        .query(&mut conn)
        .unwrap()
}

async fn until_queued(store: &RedisStore, dsn: &str, resource: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while queued(store, dsn, resource) < n {
        assert!(
            Instant::now() < deadline,
            "{n} waiters never queued on {resource}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn lock(store: &RedisStore, resource: &str) -> Lock {
    LockFactory::new(store.clone())
        .create_lock(resource)
        .with_ttl(Some(TTL))
}

/// `try_acquire` and blocking `acquire` of free, never-used resources, in interleaved rounds;
/// the sample is the acquire call alone. The third summary is of every 65th blocking acquire
/// (where a sweep of idle subscriptions used to stall the acquiring task).
async fn free_lock(store: &RedisStore) -> (Summary, Summary, Summary) {
    let warm = lock(store, "bench:warm");
    warm.acquire().await.unwrap();
    let _ = warm.release().await.unwrap();
    let (mut tries, mut acquires, mut every_65th) = (Vec::new(), Vec::new(), Vec::new());
    let nonce = monotonic_ns();
    for round in 0..ROUNDS {
        for blocking in [false, true] {
            for i in 0..PER_ROUND {
                let l = lock(store, &format!("bench:free:{nonce}:{round}:{blocking}:{i}"));
                let t = Instant::now();
                if blocking {
                    l.acquire().await.unwrap();
                    acquires.push(t.elapsed());
                    if acquires.len() % 65 == 0 {
                        every_65th.push(t.elapsed());
                    }
                } else {
                    assert!(l.try_acquire().await.unwrap());
                    tries.push(t.elapsed());
                }
                let _ = l.release().await.unwrap();
            }
        }
    }
    (
        Summary::of(tries),
        Summary::of(acquires),
        Summary::of(every_65th),
    )
}

/// A child process waits (blocking acquire) while this one holds; the sample is this release →
/// the child holds (one monotonic clock for both). Interleaved with it: an uncontended acquire
/// + release after the same idle time.
async fn handoffs_across(store: &RedisStore, dsn: &str, cpu: i32) -> (Summary, Summary) {
    let resource = format!("bench:across:{cpu}");
    let mut child = spawn_child(&["handoff", dsn, &resource]);
    pin(&child.id().to_string(), cpu);
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = BufReader::new(child.stdout.take().unwrap());
    let holder = lock(store, &resource);
    let idle = lock(store, &format!("{resource}:idle"));
    let (mut handoffs, mut cycles) = (Vec::new(), Vec::new());
    for i in 0..HANDOFFS {
        holder.acquire().await.unwrap();
        writeln!(to_child, "go").unwrap();
        until_queued(store, dsn, &resource, 1).await;
        tokio::time::sleep(park(i)).await;
        let released = monotonic_ns();
        let _ = holder.release().await.unwrap();
        let mut line = String::new();
        from_child.read_line(&mut line).unwrap();
        let held: u64 = line.trim().parse().unwrap();
        handoffs.push(Duration::from_nanos(held - released));
        tokio::time::sleep(park(i)).await;
        let t = Instant::now();
        idle.acquire().await.unwrap();
        let _ = idle.release().await.unwrap();
        cycles.push(t.elapsed());
    }
    writeln!(to_child, "quit").unwrap();
    child.wait().unwrap();
    (Summary::of(handoffs), Summary::of(cycles))
}

/// 100 waiters behind a holder of this library: commands per second per waiter while parked.
async fn parked_behind_ours(server: &RedisServer, store: &RedisStore) -> f64 {
    let dsn = server.url(0);
    let holder = lock(store, "bench:parked");
    holder.acquire().await.unwrap();
    let waiters = park_waiters(store, "bench:parked", 100);
    until_queued(store, &dsn, "bench:parked", 100).await;
    let rate = command_rate(server, 100).await;
    stop(waiters).await;
    let _ = holder.release().await.unwrap();
    rate
}

/// 100 waiters of this library behind a Python holder (which never announces its release).
async fn parked_behind_python(server: &RedisServer, store: &RedisStore, dsn: &str) -> f64 {
    let mut py = python(&["hold", dsn, "bench:beside-py"]);
    expect_line(&mut py, "held");
    let waiters = park_waiters(store, "bench:beside-py", 100);
    until_queued(store, dsn, "bench:beside-py", 100).await;
    let rate = command_rate(server, 100).await;
    stop(waiters).await;
    writeln!(py.stdin.as_mut().unwrap(), "release").unwrap();
    expect_line(&mut py, "released");
    py.wait().unwrap();
    rate
}

/// 100 Python waiters behind a holder of this library: their own polling rate.
fn python_waiters(server: &RedisServer, dsn: &str) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = RedisStore::from_dsn(dsn).unwrap();
    let holder = lock(&store, "bench:py-waiters");
    rt.block_on(holder.acquire()).unwrap();
    let mut py = python(&["wait", dsn, "bench:py-waiters", "100"]);
    expect_line(&mut py, "parked");
    let rate = rt.block_on(command_rate(server, 100));
    writeln!(py.stdin.as_mut().unwrap(), "stop").unwrap();
    py.wait().unwrap();
    let _ = rt.block_on(holder.release()).unwrap();
    rate
}

/// Stops parked waiters and lets them go (so later rows do not count their memory going).
async fn stop(waiters: Vec<tokio::task::JoinHandle<()>>) {
    for w in &waiters {
        w.abort();
    }
    for w in waiters {
        let _ = w.await;
    }
}

fn park_waiters(store: &RedisStore, resource: &str, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let l = lock(store, resource);
            tokio::spawn(async move {
                l.acquire().await.unwrap();
            })
        })
        .collect()
}

/// Commands per second per waiter over [`PARKED_FOR`] (the two readings not counted).
async fn command_rate(server: &RedisServer, waiters: usize) -> f64 {
    let before = commands(server);
    tokio::time::sleep(PARKED_FOR).await;
    let sent = commands(server) - before - 1.0;
    sent.max(0.0) / PARKED_FOR.as_secs_f64() / waiters as f64
}

/// 100 waiters in this process; each takes the lock and releases it at once.
async fn chain_in_process(server: &RedisServer, store: &RedisStore) -> (f64, f64) {
    let dsn = server.url(0);
    let holder = lock(store, "bench:chain1");
    holder.acquire().await.unwrap();
    let waiters: Vec<_> = (0..100)
        .map(|_| {
            let l = lock(store, "bench:chain1");
            tokio::spawn(async move {
                l.acquire().await.unwrap();
                let _ = l.release().await.unwrap();
            })
        })
        .collect();
    until_queued(store, &dsn, "bench:chain1", 100).await;
    server.cli(&["CONFIG", "RESETSTAT"]);
    let before = commands(server);
    let _ = holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    let sent = commands(server) - before - 1.0;
    (server.command_calls("evalsha") as f64 / 100.0, sent / 100.0)
}

/// 10 child processes with 10 waiters each.
async fn chain_in_processes(server: &RedisServer, store: &RedisStore, dsn: &str) -> (f64, f64) {
    let holder = lock(store, "bench:chain10");
    holder.acquire().await.unwrap();
    let children: Vec<Child> = (0..10)
        .map(|_| spawn_child(&["waiters", dsn, "bench:chain10", "10"]))
        .collect();
    until_queued(store, dsn, "bench:chain10", 100).await;
    server.cli(&["CONFIG", "RESETSTAT"]);
    let before = commands(server);
    let _ = holder.release().await.unwrap();
    for mut c in children {
        let status = tokio::task::spawn_blocking(move || c.wait().unwrap())
            .await
            .unwrap();
        assert!(status.success());
    }
    let sent = commands(server) - before - 1.0;
    (server.command_calls("evalsha") as f64 / 100.0, sent / 100.0)
}

/// `n` parked waiters: the server's and this process's CPU share while they wait.
async fn parked_cpu(server: &RedisServer, store: &RedisStore, n: usize) -> (f64, f64) {
    let dsn = server.url(0);
    let resource = format!("bench:cpu:{n}");
    let holder = lock(store, &resource);
    holder.acquire().await.unwrap();
    let waiters = park_waiters(store, &resource, n);
    until_queued(store, &dsn, &resource, n).await;
    let (s0, c0, t0) = (server_cpu(server), own_cpu(), Instant::now());
    tokio::time::sleep(PARKED_FOR).await;
    let wall = t0.elapsed().as_secs_f64();
    let out = ((server_cpu(server) - s0) / wall, (own_cpu() - c0) / wall);
    stop(waiters).await;
    let _ = holder.release().await.unwrap();
    out
}

/// Heap bytes per held lock, 10,000 locks held (each its own resource).
async fn bytes_per_lock(factory: LockFactory) -> f64 {
    let warm = factory.create_lock("bench:mem:warm").with_ttl(Some(TTL));
    assert!(warm.try_acquire().await.unwrap());
    let _ = warm.release().await.unwrap();
    const N: usize = 10_000;
    let mut held = Vec::with_capacity(N);
    let before = live_bytes();
    for i in 0..N {
        let l = factory
            .create_lock(format!("bench:mem:{i:06}"))
            .with_ttl(Some(TTL));
        assert!(l.try_acquire().await.unwrap());
        held.push(l);
    }
    let after = live_bytes();
    for l in &held {
        let _ = l.release().await.unwrap();
    }
    (after - before) as f64 / N as f64
}

fn python(args: &[&str]) -> Child {
    Command::new(xtr_lock_testkit::python::python_with_peers())
        .arg(peer_script("waiting_bench.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the peers' Python")
}

fn expect_line(child: &mut Child, want: &str) {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), want, "the Python half said {line:?}");
}

fn python_memory(dsn: &str) -> f64 {
    let out = Command::new(xtr_lock_testkit::python::python_with_peers())
        .arg(peer_script("waiting_bench.py"))
        .args(["memory", dsn, "10000"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["bytes_per_lock"].as_f64().unwrap()
}

fn spawn_child(args: &[&str]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .arg("child")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The other process of a benchmark: `handoff DSN RESOURCE` (at each `go`, a blocking acquire,
/// then the monotonic time it held, then a release) or `waiters DSN RESOURCE K` (K waiters that
/// each acquire and release).
fn child(args: &[String]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = RedisStore::from_dsn(&args[1]).unwrap();
    match args[0].as_str() {
        "handoff" => {
            let l = lock(&store, &args[2]);
            let stdin = std::io::stdin();
            let mut out = std::io::stdout();
            for line in stdin.lock().lines() {
                if line.unwrap() != "go" {
                    return;
                }
                rt.block_on(async {
                    l.acquire().await.unwrap();
                    let held = monotonic_ns();
                    writeln!(out, "{held}").unwrap();
                    out.flush().unwrap();
                    let _ = l.release().await.unwrap();
                });
            }
        }
        "waiters" => {
            let k: usize = args[3].parse().unwrap();
            rt.block_on(async {
                let tasks: Vec<_> = (0..k)
                    .map(|_| {
                        let l = lock(&store, &args[2]);
                        tokio::spawn(async move {
                            l.acquire().await.unwrap();
                            let _ = l.release().await.unwrap();
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            });
        }
        other => panic!("unknown child {other}"),
    }
}
