//! RedisStore on a 3-master Redis Cluster against the same store on one server, side by side in
//! one run: the uncontended cycle and the hand-off across processes, in interleaved rounds (the
//! order swapped every round), both unpinned and with every server on one vCPU and every client
//! on the other (`taskset`); then what a hand-off costs the servers with 10 to 300 waiters
//! spread over resources on every master (`INFO commandstats`, summed over the masters).
//!
//! `cargo run --release -p xtr-lock-bench --bin cluster-bench` prints Markdown tables.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use xtr_lock::{Lock, LockFactory, Lockable as _, RedisStore};
use xtr_lock_bench::{Summary, cell, monotonic_ns, park};
use xtr_lock_testkit::redis::RedisServer;
use xtr_lock_testkit::redis_cluster::RedisCluster;

const ROUNDS: usize = 10;
const CYCLES_PER_ROUND: usize = 300;
const HANDOFFS: usize = 100;
const TTL: Duration = Duration::from_secs(30);
/// Resources the waiters of the command count spread over (on every master).
const RESOURCES: usize = 10;

/// One deployment under test: its store, its servers' ports and pids, one name per master.
struct Side {
    label: &'static str,
    dsn: String,
    store: RedisStore,
    ports: Vec<u16>,
    pids: Vec<String>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(&args[2..]);
    }
    let single = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let sides = [
        side("one server", single.url(0), vec![single.port()]),
        side("3-master cluster", cluster.dsn(), cluster.masters()),
    ];
    eprintln!(
        "one server on {}, cluster masters on {:?}",
        single.port(),
        cluster.masters()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Names spread over the cluster's masters (the same names on the one server).
    let names = spread_names(&cluster, RESOURCES);

    println!(
        "| placement | cycle, one server | cycle, cluster | ratio of p50s | hand-off, one server | hand-off, cluster | ratio of p50s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (placement, servers_cpu, client_cpu) in [
        ("unpinned", -1, -1),
        ("servers on vCPU 0, clients on vCPU 1", 0, 1),
    ] {
        for s in &sides {
            for pid in &s.pids {
                pin(pid, servers_cpu);
            }
        }
        pin(&std::process::id().to_string(), client_cpu);
        let cycles = rt.block_on(cycles(&sides, &names));
        let handoffs = rt.block_on(handoffs(&sides, client_cpu));
        println!(
            "| {placement} | {} | {} | {:.2} | {} | {} | {:.2} |",
            cell(&cycles[0]),
            cell(&cycles[1]),
            ratio(cycles[1].p50, cycles[0].p50),
            cell(&handoffs[0]),
            cell(&handoffs[1]),
            ratio(handoffs[1].p50, handoffs[0].p50),
        );
    }
    for s in &sides {
        for pid in &s.pids {
            pin(pid, -1);
        }
    }
    pin(&std::process::id().to_string(), -1);

    rt.block_on(command_counts(&sides, &names));
}

/// What hand-offs cost the servers: 10 processes with `per` waiters on each of `names`.
async fn command_counts(sides: &[Side], names: &[String]) {
    println!();
    println!(
        "| deployment | waiters (processes × per resource × resources) | commands / hand-off | scripts / hand-off | (S)PUBLISH / hand-off | other commands |"
    );
    println!("|---|---|---|---|---|---|");
    for per in [1, 10, 30] {
        for s in sides {
            let (waiters, stats) = chain(s, names, per).await;
            eprintln!("{}, {waiters} waiters: {stats:?}", s.label);
            let n = waiters as f64;
            let scripts = stats.get("evalsha").copied().unwrap_or(0) as f64;
            let publish = stats.get("publish").or(stats.get("spublish")).copied();
            let total: u64 = stats.values().sum();
            let others: Vec<String> = stats
                .iter()
                .filter(|(c, _)| !is_script_work(c))
                .map(|(c, k)| format!("{c} {k}"))
                .collect();
            println!(
                "| {} | {waiters} (10 × {per} × {RESOURCES}) | {:.2} | {:.2} | {:.2} | {} |",
                s.label,
                total as f64 / n,
                scripts / n,
                publish.unwrap_or(0) as f64 / n,
                if others.is_empty() {
                    "none".to_owned()
                } else {
                    others.join(", ")
                },
            );
        }
    }
}

fn side(label: &'static str, dsn: String, ports: Vec<u16>) -> Side {
    let pids = ports
        .iter()
        .map(|&p| info_field(p, "server", "process_id"))
        .collect();
    Side {
        label,
        store: RedisStore::from_dsn(&dsn).unwrap(),
        dsn,
        ports,
        pids,
    }
}

/// `n` names `bench:c:<k>` spread evenly over the cluster's masters.
fn spread_names(cluster: &RedisCluster, n: usize) -> Vec<String> {
    let masters = cluster.masters();
    let mut by_master: Vec<Vec<String>> = vec![Vec::new(); masters.len()];
    for k in 0.. {
        let name = format!("bench:c:{k}");
        let m = cluster.master_of_slot(RedisCluster::slot_of(name.as_bytes()));
        let i = masters.iter().position(|&p| p == m).unwrap();
        if by_master[i].len() < n.div_ceil(masters.len()) {
            by_master[i].push(name);
        }
        if by_master.iter().map(Vec::len).sum::<usize>() >= n {
            break;
        }
    }
    // Round robin over the masters, so name k is on master k % 3.
    let mut names = Vec::new();
    for k in 0..n {
        let list = &mut by_master[k % masters.len()];
        if !list.is_empty() {
            names.push(list.remove(0));
        }
    }
    names.extend(by_master.into_iter().flatten());
    names.truncate(n);
    names
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

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (package redis-tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn info_field(port: u16, section: &str, field: &str) -> String {
    redis_cli(port, &["INFO", section])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
        .trim()
        .to_owned()
}

/// Calls per command since the last `CONFIG RESETSTAT`, summed over `ports` (calls inside
/// scripts included; the `INFO` and `CONFIG` of the measurement left out).
fn command_calls(ports: &[u16]) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    for &port in ports {
        for line in redis_cli(port, &["INFO", "commandstats"]).lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(":calls="))
            else {
                continue;
            };
            if matches!(name, "info" | "config" | "config|resetstat") {
                continue;
            }
            let n: u64 = rest.split(',').next().unwrap().parse().unwrap();
            *calls.entry(name.to_owned()).or_default() += n;
        }
    }
    calls
}

/// The calls a script makes (counted by the server beside the script itself).
fn is_script_work(command: &str) -> bool {
    matches!(
        command,
        "evalsha"
            | "publish"
            | "spublish"
            | "zadd"
            | "zrem"
            | "zrange"
            | "zscore"
            | "zcard"
            | "zremrangebyscore"
            | "zrangebyscore"
            | "pexpire"
            | "pexpireat"
            | "pttl"
            | "time"
            | "incr"
            | "get"
            | "set"
            | "del"
            | "exists"
            | "type"
    )
}

fn lock(store: &RedisStore, resource: &str) -> Lock {
    LockFactory::new(store.clone())
        .create_lock(resource)
        .with_ttl(Some(TTL))
}

/// Uncontended acquire + release, `ROUNDS` rounds of `CYCLES_PER_ROUND` on each side, the order
/// swapped every round, the resource moving to the next master every round.
async fn cycles(sides: &[Side], names: &[String]) -> Vec<Summary> {
    let mut samples = vec![Vec::new(); sides.len()];
    for s in sides {
        for name in names {
            let l = lock(&s.store, name);
            assert!(l.try_acquire().await.unwrap());
            let _ = l.release().await.unwrap();
        }
    }
    for round in 0..ROUNDS {
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1]
        } else {
            vec![1, 0]
        };
        for i in order {
            let l = lock(&sides[i].store, &names[round % names.len()]);
            for _ in 0..CYCLES_PER_ROUND {
                let t = Instant::now();
                assert!(l.try_acquire().await.unwrap());
                let _ = l.release().await.unwrap();
                samples[i].push(t.elapsed());
            }
        }
    }
    samples.into_iter().map(Summary::of).collect()
}

/// The number of waiters queued on `resource` (its queue key, found by name on each master).
fn queued(ports: &[u16], resource: &str) -> usize {
    let pattern = format!("*xtr-lock:*queue:{resource}");
    let mut n = 0;
    for &p in ports {
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{p}"))
            .unwrap()
            .get_connection()
            .unwrap();
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg(&pattern).query(&mut conn).unwrap();
        for key in keys {
            n += redis::cmd("ZCARD")
                .arg(key)
                .query::<usize>(&mut conn)
                .unwrap();
        }
    }
    n
}

async fn until_queued(ports: &[u16], resource: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while queued(ports, resource) < n {
        assert!(
            Instant::now() < deadline,
            "{n} waiters never queued on {resource}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Hand-offs to a waiting child process (one per side), interleaved: each round one on each
/// side, the order swapped every round; the sample is this release → the child holds (one
/// monotonic clock). The resource moves over the masters with the round.
async fn handoffs(sides: &[Side], cpu: i32) -> Vec<Summary> {
    let mut children: Vec<(
        Child,
        std::process::ChildStdin,
        BufReader<std::process::ChildStdout>,
    )> = sides
        .iter()
        .map(|s| {
            let mut c = spawn_child(&["handoff", &s.dsn]);
            pin(&c.id().to_string(), cpu);
            let stdin = c.stdin.take().unwrap();
            let stdout = BufReader::new(c.stdout.take().unwrap());
            (c, stdin, stdout)
        })
        .collect();
    let mut samples = vec![Vec::new(); sides.len()];
    // One unmeasured round first: the child's connections and subscriptions.
    for i in 0..=HANDOFFS {
        let order: Vec<usize> = if i % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
        for k in order {
            let resource = format!("bench:h:{}", i % 3);
            let holder = lock(&sides[k].store, &resource);
            holder.acquire().await.unwrap();
            let (_, to_child, from_child) = &mut children[k];
            writeln!(to_child, "{resource}").unwrap();
            until_queued(&sides[k].ports, &resource, 1).await;
            tokio::time::sleep(park(i)).await;
            let released = monotonic_ns();
            let _ = holder.release().await.unwrap();
            let mut line = String::new();
            from_child.read_line(&mut line).unwrap();
            let held: u64 = line.trim().parse().unwrap();
            if i > 0 {
                samples[k].push(Duration::from_nanos(held - released));
            }
        }
    }
    for (mut c, stdin, _) in children {
        drop(stdin);
        c.wait().unwrap();
    }
    samples.into_iter().map(Summary::of).collect()
}

/// 10 child processes with `per` waiters on each of `names`; this process holds every name,
/// then releases them all, and the chain runs until every waiter held once. Returns the number
/// of waiters (= hand-offs) and the servers' command calls meanwhile.
async fn chain(side: &Side, names: &[String], per: usize) -> (usize, BTreeMap<String, u64>) {
    let nonce = monotonic_ns();
    let resources: Vec<String> = names.iter().map(|n| format!("{n}:{nonce}")).collect();
    let holders: Vec<Lock> = resources.iter().map(|r| lock(&side.store, r)).collect();
    for h in &holders {
        h.acquire().await.unwrap();
    }
    let list = resources.join(",");
    let children: Vec<Child> = (0..10)
        .map(|_| spawn_child(&["waiters", &side.dsn, &list, &per.to_string()]))
        .collect();
    for r in &resources {
        until_queued(&side.ports, r, 10 * per).await;
    }
    for &p in &side.ports {
        redis_cli(p, &["CONFIG", "RESETSTAT"]);
    }
    for h in &holders {
        let _ = h.release().await.unwrap();
    }
    for mut c in children {
        let status = tokio::task::spawn_blocking(move || c.wait().unwrap())
            .await
            .unwrap();
        assert!(status.success());
    }
    (10 * per * names.len(), command_calls(&side.ports))
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

/// The other process: `handoff DSN` (for each resource read on stdin, a blocking acquire, the
/// monotonic time it held, a release) or `waiters DSN R1,R2,… K` (K waiters on each resource,
/// each acquiring and releasing once).
fn child(args: &[String]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = RedisStore::from_dsn(&args[1]).unwrap();
    match args[0].as_str() {
        "handoff" => {
            let mut out = std::io::stdout();
            for line in std::io::stdin().lock().lines() {
                let l = lock(&store, &line.unwrap());
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
                let tasks: Vec<_> = args[2]
                    .split(',')
                    .flat_map(|r| std::iter::repeat_n(r.to_owned(), k))
                    .map(|r| {
                        let l = lock(&store, &r);
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
