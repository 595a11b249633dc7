//! Quorum locks over three local redis-servers against one server, and against the `rslock`
//! crate's Redlock over the same three, in one run.
//!
//! `cargo run --release -p xtr-lock-bench --bin quorum-bench` prints two Markdown tables:
//! loopback, where the three servers and the client share the machine's cores, and an emulated
//! network, where each server sits behind a delay proxy (this binary, started again as
//! `quorum-bench delay-proxy PORT MIN_US MAX_US`) adding 250–1250 µs each way. `SCENARIO=loopback`
//! or `SCENARIO=network` runs one; `ONLY=<part of a row's name>` keeps only some rows.
//!
//! The contenders run in interleaved rounds (each round runs every contender for a slice of the
//! cycles, in a rotating order), so drift in the machine's speed during the run affects them
//! alike. Besides latency, each row shows where the time goes: the client's CPU time per cycle
//! (this process) and the servers' (the sum of `used_cpu_sys + used_cpu_user` deltas of the
//! servers involved, from `INFO cpu`). The floor rows are bare `PING`s: two round trips to one
//! server, and two rounds of `PING`s sent to all three at once.
//!
//! On loopback, after the rounds, the peers' quorums over the same three servers run in their
//! own processes: Python xtr-lock 4.1.0's and Symfony Lock 5.4's `CombinedStore`s, which ask
//! their stores one after another.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use xtr_lock::Lockable as _;
use xtr_lock::store::{CombinedStore, ConsensusStrategy};
use xtr_lock::{Lock, LockFactory, RedisStore};
use xtr_lock_bench::{Summary, cell, human};
use xtr_lock_testkit::redis::RedisServer;

const ROUNDS: usize = 20;
const PER_ROUND: usize = 250;
const WARMUP: usize = 200;
/// Cycles per round with the emulated network (each takes milliseconds there).
const NET_PER_ROUND: usize = 50;
/// Cycles for each peer's quorum (slower, and in its own process).
const PEER_CYCLES: usize = 1_000;
const TTL: Duration = Duration::from_secs(30);

/// One acquire + release (or the floor's two round trips).
type Cycle<'a> = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = ()> + 'a>> + 'a>;

struct Contender<'a> {
    name: &'static str,
    /// Indexes of the servers it talks to (for the server CPU column).
    servers: Vec<usize>,
    cycle: Cycle<'a>,
    samples: Vec<Duration>,
    client_cpu: Duration,
    server_cpu: Duration,
}

fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `used_cpu_sys + used_cpu_user` from the text of `INFO cpu` (microsecond resolution).
fn used_cpu(info: &str) -> Duration {
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("INFO cpu has {name}"))
    };
    Duration::from_secs_f64(field("used_cpu_sys") + field("used_cpu_user"))
}

/// The CPU time one server has used so far.
async fn server_cpu(conn: &mut redis::aio::MultiplexedConnection) -> Duration {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .unwrap();
    used_cpu(&info)
}

async fn servers_cpu(conns: &mut [redis::aio::MultiplexedConnection], which: &[usize]) -> Duration {
    let mut total = Duration::ZERO;
    for &i in which {
        total += server_cpu(&mut conns[i]).await;
    }
    total
}

fn lock_cycle(lock: &Lock) -> Cycle<'_> {
    Box::new(move || {
        Box::pin(async move {
            assert!(lock.try_acquire().await.unwrap());
            let _ = lock.release().await.unwrap();
        })
    })
}

fn ping_cycle(conns: Vec<redis::aio::MultiplexedConnection>) -> Cycle<'static> {
    Box::new(move || {
        let mut conns = conns.clone();
        Box::pin(async move {
            for _ in 0..2 {
                join_all(conns.iter_mut().map(|c| async move {
                    let _: String = redis::cmd("PING").query_async(c).await.unwrap();
                }))
                .await;
            }
        })
    })
}

fn rslock_cycle(rl: &rslock::LockManager) -> Cycle<'_> {
    Box::new(move || {
        Box::pin(async move {
            let lock = rl.lock("bench:rslock", TTL).await.unwrap();
            rl.unlock(&lock).await;
        })
    })
}

// The contenders' cycles are not `Send` (neither is rslock's lock manager): the whole run stays
// on this binary's one thread.
#[allow(clippy::future_not_send)]
async fn run(urls: &[String], rounds: usize, per_round: usize) -> Vec<Contender<'static>> {
    let clients: Vec<redis::Client> = urls
        .iter()
        .map(|u| redis::Client::open(u.as_str()).unwrap())
        .collect();
    let mut conns = Vec::new();
    for c in &clients {
        conns.push(c.get_multiplexed_async_connection().await.unwrap());
    }
    // Leaked: the contenders borrow them for the whole run of this short-lived binary.
    let single: &'static Lock = Box::leak(Box::new(
        LockFactory::new(RedisStore::from_dsn(&urls[0]).unwrap())
            .with_ttl(Some(TTL))
            .create_lock("bench:single"),
    ));
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let quorum: &'static Lock = Box::leak(Box::new(
        LockFactory::new(CombinedStore::from_dsns(&refs, ConsensusStrategy).unwrap())
            .with_ttl(Some(TTL))
            .create_lock("bench:quorum"),
    ));
    let mut rl = rslock::LockManager::new(urls.to_vec());
    rl.set_retry(1, Duration::from_millis(1));
    let rl: &'static rslock::LockManager = Box::leak(Box::new(rl));
    let all: Vec<usize> = (0..urls.len()).collect();
    let contender = |name, servers, cycle| Contender {
        name,
        servers,
        cycle,
        samples: Vec::with_capacity(rounds * per_round),
        client_cpu: Duration::ZERO,
        server_cpu: Duration::ZERO,
    };
    let mut contenders = vec![
        contender(
            "floor: 2 × `PING`, one server",
            vec![0],
            ping_cycle(vec![conns[0].clone()]),
        ),
        contender(
            "floor: 2 × `PING` to all three at once",
            all.clone(),
            ping_cycle(conns.clone()),
        ),
        contender("xtr-lock, one redis-server", vec![0], lock_cycle(single)),
        contender(
            "xtr-lock, quorum of 3 (`CombinedStore`, consensus)",
            all.clone(),
            lock_cycle(quorum),
        ),
        contender("rslock 0.10 Redlock over the same 3", all, rslock_cycle(rl)),
    ];
    // For profiling one contender: `ONLY=quorum perf record … quorum-bench`.
    if let Ok(only) = std::env::var("ONLY") {
        contenders.retain(|c| c.name.contains(only.as_str()));
    }
    for c in &mut contenders {
        for _ in 0..WARMUP {
            (c.cycle)().await;
        }
    }
    let k = contenders.len();
    for round in 0..rounds {
        for j in 0..k {
            let c = &mut contenders[(round + j) % k];
            let servers_before = servers_cpu(&mut conns, &c.servers).await;
            let cpu_before = process_cpu();
            for _ in 0..per_round {
                let t = Instant::now();
                (c.cycle)().await;
                c.samples.push(t.elapsed());
            }
            c.client_cpu += process_cpu() - cpu_before;
            c.server_cpu += servers_cpu(&mut conns, &c.servers).await - servers_before;
        }
    }
    contenders
}

/// The CPU time the servers have used so far, summed, through `redis-cli`.
fn servers_cpu_now(servers: &[RedisServer]) -> Duration {
    servers
        .iter()
        .map(|s| used_cpu(&s.cli(&["INFO", "cpu"])))
        .sum()
}

/// A peer's quorum run in its own process: its latencies and the servers' CPU per cycle.
fn peer(servers: &[RedisServer], run: impl FnOnce() -> Summary) -> (Summary, Duration) {
    let before = servers_cpu_now(servers);
    let summary = run();
    let per_cycle = (servers_cpu_now(servers) - before) / summary.n as u32;
    (summary, per_cycle)
}

fn python_quorum(urls: &[String]) -> Summary {
    let mut args = vec![PEER_CYCLES.to_string()];
    args.extend(urls.iter().cloned());
    Summary::from_json(&xtr_lock_bench::run_python("quorum_bench.py", &args))
}

fn symfony_quorum(servers: &[RedisServer]) -> Summary {
    let port = |i: usize| servers[i].port().to_string();
    let args = [
        "127.0.0.1".to_owned(),
        port(0),
        "quorum".to_owned(),
        PEER_CYCLES.to_string(),
        port(1),
        port(2),
    ];
    Summary::from_json(&xtr_lock_bench::run_php(&args))
}

/// One-way delays of the emulated network: uniform in this range, in each direction.
const NET_DELAY: (Duration, Duration) = (Duration::from_micros(250), Duration::from_micros(1250));

/// Starts this binary as a delay proxy in front of `port` (see `xtr_lock_bench::delay_proxy`);
/// returns the child and the port it listens on.
fn delay_proxy(port: u16) -> (std::process::Child, u16) {
    use std::io::BufRead as _;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["delay-proxy", &port.to_string()])
        .args([NET_DELAY.0, NET_DELAY.1].map(|d| d.as_micros().to_string()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the delay proxy starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().parse().expect("the proxy's port"))
}

type Peers = Vec<(&'static str, (Summary, Duration))>;

fn report(contenders: &[Contender<'_>], peers: &Peers, rounds: usize, per_round: usize) {
    let cycles = (rounds * per_round) as u32;
    let find = |name: &str| contenders.iter().find(|c| c.name.starts_with(name));
    let p50 = |name: &str| Some(Summary::of(find(name)?.samples.clone()).p50.as_secs_f64());
    // Paired by round: the median of rslock's p50 over ours, round by round, and how many
    // rounds we won (drift in the machine's speed cancels within a round).
    let paired = || -> Option<(f64, usize)> {
        let (ours, theirs) = (find("xtr-lock, quorum")?, find("rslock")?);
        let round_p50 = |c: &Contender<'_>, r: usize| {
            Summary::of(c.samples[r * per_round..(r + 1) * per_round].to_vec())
                .p50
                .as_secs_f64()
        };
        let mut ratios: Vec<f64> = (0..rounds)
            .map(|r| round_p50(theirs, r) / round_p50(ours, r))
            .collect();
        let won = ratios.iter().filter(|&&x| x > 1.0).count();
        ratios.sort_by(f64::total_cmp);
        Some((ratios[rounds / 2], won))
    };
    println!("| acquire + release | p50 (p99) | client CPU / cycle | servers' CPU / cycle |");
    println!("|---|---|---|---|");
    for c in contenders {
        println!(
            "| {} | {} | {} | {} |",
            c.name,
            cell(&Summary::of(c.samples.clone())),
            human(c.client_cpu / cycles),
            human(c.server_cpu / cycles),
        );
    }
    for (name, (summary, server_cpu)) in peers {
        println!(
            "| {name} | {} | — | {} |",
            cell(summary),
            human(*server_cpu)
        );
    }
    let (Some(quorum), Some(one), Some(rslock), Some(floor)) = (
        p50("xtr-lock, quorum"),
        p50("xtr-lock, one"),
        p50("rslock"),
        p50("floor: 2 × `PING` to all"),
    ) else {
        return;
    };
    println!();
    println!(
        "Ratios (p50): quorum of 3 = {:.2}× one server; rslock = {:.2}× our quorum; \
         quorum = {:.2}× its PING floor. {rounds} interleaved rounds of {per_round} cycles each.",
        quorum / one,
        rslock / quorum,
        quorum / floor,
    );
    for (name, (summary, _)) in peers {
        println!(
            "{name}: {:.2}× our quorum's p50 ({PEER_CYCLES} cycles, after the rounds).",
            summary.p50.as_secs_f64() / quorum
        );
    }
    if let Some((median, won)) = paired() {
        println!(
            "Round by round: rslock's p50 / ours, median {median:.2}; the quorum was faster in \
             {won} of {rounds} rounds."
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, target, min, max] = args.as_slice()
        && mode == "delay-proxy"
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        println!("{}", listener.local_addr().unwrap().port());
        let us = |v: &str| Duration::from_micros(v.parse().expect("microseconds"));
        xtr_lock_bench::delay_proxy::serve(
            listener,
            target.parse().expect("a port"),
            us(min),
            us(max),
        );
    }
    // `SCENARIO=loopback` or `SCENARIO=network` runs one of the two.
    let scenario = std::env::var("SCENARIO").unwrap_or_default();
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url(0)).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if scenario != "network" {
        println!("Loopback (the servers and the client share this machine's cores):\n");
        let contenders = rt.block_on(run(&urls, ROUNDS, PER_ROUND));
        let peers: Peers = if std::env::var_os("ONLY").is_some() {
            Vec::new()
        } else {
            vec![
                (
                    "Python xtr-lock 4.1.0 `CombinedStore` (asks one after another)",
                    peer(&servers, || python_quorum(&urls)),
                ),
                (
                    "Symfony Lock 5.4 `CombinedStore` (php; asks one after another)",
                    peer(&servers, || symfony_quorum(&servers)),
                ),
            ]
        };
        report(&contenders, &peers, ROUNDS, PER_ROUND);
    }
    if scenario != "loopback" {
        let proxies: Vec<(std::process::Child, u16)> =
            servers.iter().map(|s| delay_proxy(s.port())).collect();
        let urls: Vec<String> = proxies
            .iter()
            .map(|(_, port)| format!("redis://127.0.0.1:{port}/0"))
            .collect();
        println!(
            "\nEmulated network (each server behind a delay proxy: {}–{} µs one way, uniform, \
             in order):\n",
            NET_DELAY.0.as_micros(),
            NET_DELAY.1.as_micros()
        );
        let contenders = rt.block_on(run(&urls, ROUNDS, NET_PER_ROUND));
        report(&contenders, &Vec::new(), ROUNDS, NET_PER_ROUND);
        for (mut child, _) in proxies {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
