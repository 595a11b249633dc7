//! The servers of a run and the DSNs its workers use: straight to the servers, or through a
//! proxy per worker and server (delayed for [`Fault::Delay`], freezable for
//! [`Fault::Partition`]); what the faults do to the servers; and what must be left of the lock
//! once the run is over.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use xtr_lock_testkit::delay_proxy::Freeze;
use xtr_lock_testkit::etcd::EtcdCluster;
use xtr_lock_testkit::mariadb::MariaDbServer;
use xtr_lock_testkit::memcached::MemcachedServer;
use xtr_lock_testkit::postgres::PostgresServer;
use xtr_lock_testkit::redis::RedisServer;

use crate::{Fault, Scenario, Target};

/// The servers of a target, started once and shared by its scenarios run one after another.
#[derive(Debug)]
pub struct Servers {
    pub(crate) target: Target,
    pub(crate) redis: Vec<RedisServer>,
    pub(crate) postgres: Option<PostgresServer>,
    pub(crate) mariadb: Option<MariaDbServer>,
    pub(crate) memcached: Option<MemcachedServer>,
    /// The etcd target's cluster.
    pub(crate) etcd: Option<EtcdCluster>,
    /// The flock and SQLite targets' directory, removed with the servers.
    dir: Option<tempfile::TempDir>,
}

impl Servers {
    /// Starts the servers `target` needs (none for flock, SQLite and semaphores).
    ///
    /// # Errors
    ///
    /// When a temp directory cannot be made (the testkit panics when a server does not start).
    pub fn start(target: Target) -> anyhow::Result<Servers> {
        let redis_n = match target {
            Target::Redis | Target::PubSub => 1,
            Target::Quorum => 3,
            _ => 0,
        };
        let dir = matches!(target, Target::Flock | Target::Sqlite)
            .then(|| tempfile::Builder::new().prefix("xtr-faults-").tempdir())
            .transpose()?;
        Ok(Servers {
            target,
            redis: (0..redis_n).map(|_| RedisServer::start()).collect(),
            postgres: matches!(target, Target::SqlPostgres | Target::Advisory)
                .then(PostgresServer::start),
            mariadb: matches!(target, Target::SqlMariaDb | Target::GetLock)
                .then(MariaDbServer::start),
            memcached: (target == Target::Memcached).then(MemcachedServer::start),
            etcd: (target == Target::Etcd).then(|| EtcdCluster::start(3)),
            dir,
        })
    }

    /// The target they serve.
    pub fn target(&self) -> Target {
        self.target
    }
}

/// One scenario's view of the servers: its resource and the DSNs its workers use.
pub(crate) struct Stores {
    pub(crate) servers: Servers,
    /// The resource every worker contends for: unique per run (SysV semaphores are one
    /// namespace per machine, and servers are shared by a target's scenarios).
    pub(crate) resource: String,
    /// The DSNs straight to the servers.
    direct: Vec<String>,
    /// Per worker, the DSNs it uses (through its own proxies, when the fault wants proxies).
    per_worker: Vec<Vec<String>>,
    /// Per worker, the switch of its proxies (partitions).
    pub(crate) freezes: Vec<Freeze>,
}

impl std::ops::Deref for Stores {
    type Target = Servers;
    fn deref(&self) -> &Servers {
        &self.servers
    }
}

impl std::ops::DerefMut for Stores {
    fn deref_mut(&mut self) -> &mut Servers {
        &mut self.servers
    }
}

impl Stores {
    pub(crate) fn new(xtr: &Path, servers: Servers, scenario: &Scenario) -> anyhow::Result<Stores> {
        static RUNS: AtomicU32 = AtomicU32::new(0);
        let ports = servers.ports();
        let direct = servers.dsns(&ports);
        let mut stores = Stores {
            servers,
            resource: format!(
                "fault-suite-{}-{}",
                std::process::id(),
                RUNS.fetch_add(1, Ordering::Relaxed)
            ),
            direct,
            per_worker: Vec::new(),
            freezes: Vec::new(),
        };
        let proxied = matches!(scenario.fault, Fault::Delay | Fault::Partition);
        for _ in 0..scenario.workers + scenario.readers {
            if proxied {
                let freeze = Freeze::default();
                let delay = if scenario.fault == Fault::Delay {
                    (Duration::from_millis(1), Duration::from_millis(3))
                } else {
                    (Duration::ZERO, Duration::ZERO)
                };
                let mine = ports
                    .iter()
                    .map(|&p| proxy(p, delay, &freeze))
                    .collect::<anyhow::Result<Vec<u16>>>()?;
                stores.per_worker.push(stores.servers.dsns(&mine));
                stores.freezes.push(freeze);
            } else {
                stores.per_worker.push(stores.direct.clone());
            }
        }
        stores.migrate(xtr)?;
        Ok(stores)
    }

    /// The table stores' tables, made once before the workers start (`xtr-lock migrate`).
    fn migrate(&self, xtr: &Path) -> anyhow::Result<()> {
        if !matches!(
            self.target,
            Target::SqlPostgres | Target::SqlMariaDb | Target::Sqlite
        ) {
            return Ok(());
        }
        let out = Command::new(xtr)
            .arg("migrate")
            .args(self.direct_args())
            .stdin(Stdio::null())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "xtr-lock migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// `--store D` for each DSN worker `w` uses.
    pub(crate) fn worker_args(&self, w: usize) -> Vec<String> {
        store_args(&self.per_worker[w])
    }

    /// `--store D` for each DSN straight to the servers.
    pub(crate) fn direct_args(&self) -> Vec<String> {
        store_args(&self.direct)
    }
}

impl Servers {
    /// The servers' client ports, in member order.
    fn ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.redis.iter().map(RedisServer::port).collect();
        ports.extend(self.postgres.iter().map(PostgresServer::port));
        ports.extend(self.mariadb.iter().map(MariaDbServer::port));
        ports.extend(self.memcached.iter().map(MemcachedServer::port));
        if let Some(cluster) = &self.etcd {
            ports.extend(
                cluster
                    .endpoints()
                    .iter()
                    .filter_map(|e| e.rsplit_once(':')?.1.parse::<u16>().ok()),
            );
        }
        ports
    }

    /// The DSNs for servers listening at `ports` (the servers' own, or proxies').
    fn dsns(&self, ports: &[u16]) -> Vec<String> {
        let redis = "/0?socket_connect_timeout=0.5&socket_timeout=0.5";
        let sql = "connect_timeout=1&statement_timeout=2";
        let dir = || {
            self.dir
                .as_ref()
                .map(|d| d.path().display().to_string())
                .unwrap_or_default()
        };
        let each = |f: &dyn Fn(u16) -> String| ports.iter().map(|&p| f(p)).collect();
        match self.target {
            Target::Flock => vec![format!("flock://{}", dir())],
            Target::Sqlite => vec![format!("sqlite://{}/locks.db", dir())],
            Target::Semaphore => vec!["semaphore".to_owned()],
            Target::Redis | Target::Quorum => each(&|p| format!("redis://127.0.0.1:{p}{redis}")),
            Target::PubSub => each(&|p| format!("redis+pubsub://127.0.0.1:{p}{redis}")),
            Target::Etcd => {
                let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
                vec![format!("etcd://{}", hosts.join(","))]
            }
            Target::SqlPostgres => {
                each(&|p| format!("postgres://postgres@127.0.0.1:{p}/postgres?{sql}"))
            }
            Target::Advisory => {
                each(&|p| format!("postgres+advisory://postgres@127.0.0.1:{p}/postgres?{sql}"))
            }
            Target::SqlMariaDb => each(&|p| format!("mysql://root@127.0.0.1:{p}/xtr?{sql}")),
            Target::GetLock => each(&|p| format!("mysql+getlock://root@127.0.0.1:{p}/xtr?{sql}")),
            Target::Memcached => {
                each(&|p| format!("memcached://127.0.0.1:{p}?connect_timeout=0.5&timeout=0.5"))
            }
        }
    }

    /// SIGSTOP the first `n` servers (of a quorum, or the one server).
    pub(crate) fn pause(&self, n: usize) {
        for s in self.redis.iter().take(n) {
            s.pause();
        }
        self.postgres.iter().for_each(PostgresServer::pause);
        self.mariadb.iter().for_each(MariaDbServer::pause);
        self.memcached.iter().for_each(MemcachedServer::pause);
    }

    /// SIGCONT after [`pause`](Stores::pause).
    pub(crate) fn resume(&self, n: usize) {
        for s in self.redis.iter().take(n) {
            s.resume();
        }
        self.postgres.iter().for_each(PostgresServer::resume);
        self.mariadb.iter().for_each(MariaDbServer::resume);
        self.memcached.iter().for_each(MemcachedServer::resume);
    }

    /// Kills the server and starts it again at once: Redis and Memcached come back empty, the
    /// databases with what was committed (table rows; sessions and their locks are gone).
    pub(crate) fn restart(&mut self) {
        if let Some(s) = self.redis.first_mut() {
            s.restart();
        }
        self.postgres.iter_mut().for_each(PostgresServer::restart);
        self.mariadb.iter_mut().for_each(MariaDbServer::restart);
        self.memcached.iter_mut().for_each(MemcachedServer::restart);
    }
}

impl Stores {
    /// Ends the server-side sessions of the process `pid` (`pg_terminate_backend`, MariaDB's
    /// `KILL`, Redis's `CLIENT KILL`); whether there was one.
    pub(crate) fn terminate_sessions(&self, pid: u32) -> bool {
        let Some(server) = self.ports().first().copied() else {
            return false;
        };
        let ports = crate::sockets::client_ports(pid, server);
        if ports.is_empty() {
            return false;
        }
        let list = ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        if let Some(pg) = &self.postgres {
            let sql = format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE client_port IN ({list})"
            );
            return pg.psql(&sql) != "0";
        }
        if let Some(db) = &self.mariadb {
            // Without grant tables MariaDB's process list shows no client address: the holder
            // of a `GET_LOCK` is found by its lock, and on the table store every session but
            // this one ends (a row lock lives in no session: none may matter).
            let ids = if self.target == Target::GetLock {
                db.sql(&format!(
                    "SELECT IS_USED_LOCK(CONCAT('xtr-lock:', \
                     LEFT(SHA2(CONCAT('xtr', CHAR(0), '{}'), 256), 55)))",
                    self.resource
                ))
            } else {
                db.sql(
                    "SELECT id FROM information_schema.processlist \
                     WHERE id <> CONNECTION_ID() AND user <> 'system user'",
                )
            };
            let mut any = false;
            for id in ids.split_whitespace().filter(|id| *id != "NULL") {
                // The session may end on its own in between: an unknown id is no failure.
                any |= Command::new("mariadb")
                    .args(["--no-defaults", "-h", "127.0.0.1", "-P"])
                    .arg(db.port().to_string())
                    .args(["-u", "root", "-e", &format!("KILL {id}")])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            }
            return any;
        }
        if let Some(redis) = self.redis.first() {
            let mut any = false;
            for port in &ports {
                // The number of connections killed.
                let killed = redis.cli(&["CLIENT", "KILL", "ADDR", &format!("127.0.0.1:{port}")]);
                any |= killed.parse::<u32>().is_ok_and(|n| n > 0);
            }
            return any;
        }
        false
    }
}

fn store_args(dsns: &[String]) -> Vec<String> {
    dsns.iter()
        .flat_map(|d| ["--store".to_owned(), d.clone()])
        .collect()
}

/// A proxy in front of `port`, on threads of this process: each chunk delayed by `delay`
/// (uniform in the range), nothing forwarded while `freeze` is on.
fn proxy(port: u16, delay: (Duration, Duration), freeze: &Freeze) -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let local = listener.local_addr()?.port();
    let freeze = freeze.clone();
    std::thread::spawn(move || {
        xtr_lock_testkit::delay_proxy::serve_freezable(listener, port, delay.0, delay.1, freeze)
    });
    Ok(local)
}

/// What is still held once every holder is gone and the killed ones' leases have ended: a free
/// lock must be taken at once (`run -n` exits 0), and no key, session lock or entry may be left
/// behind.
///
/// Asked again every 200 ms until nothing is left or `wait` has passed (a killed holder's lock
/// on an expiring store lasts until its ttl): what is left then is reported.
pub(crate) fn leftovers(xtr: &Path, stores: &Stores, wait: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = left_now(xtr, stores);
        if left.is_empty() || std::time::Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn left_now(xtr: &Path, stores: &Stores) -> Vec<String> {
    let mut out = Vec::new();
    let resource = stores.resource.as_str();
    let status = Command::new(xtr)
        .arg("run")
        .args(stores.direct_args())
        .args(["--ttl", "5s", "-n", resource, "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !status.as_ref().is_ok_and(|s| s.success()) {
        out.push(format!("the lock was still held after the run: {status:?}"));
    }
    if let Some(cluster) = &stores.etcd {
        let keys =
            cluster.etcdctl_output(&["get", "--prefix", "--keys-only", &format!("{resource}/")]);
        if !keys.trim().is_empty() {
            out.push(format!(
                "etcd still has the lock's keys after the run: {keys:?}"
            ));
        }
    }
    if stores.target != Target::PubSub {
        for (i, server) in stores.redis.iter().enumerate() {
            if server.cli(&["EXISTS", resource]) != "0" {
                out.push(format!("server {i} still has the lock's key after the run"));
            }
        }
    }
    if stores.target == Target::PubSub
        && let Some(server) = stores.redis.first()
    {
        let numsub = server.cli(&["PUBSUB", "NUMSUB", resource]);
        if numsub.lines().nth(1).is_some_and(|n| n.trim() != "0") {
            out.push(format!(
                "the channel still has subscribers after the run: {numsub:?}"
            ));
        }
    }
    if let Some(m) = &stores.memcached
        && m.get(resource).is_some()
    {
        out.push("Memcached still has the lock's entry after the run".to_owned());
    }
    if let Some(pg) = &stores.postgres
        && stores.target == Target::Advisory
    {
        let n = pg.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'");
        if n != "0" {
            out.push(format!(
                "PostgreSQL still has {n} advisory locks after the run"
            ));
        }
    }
    out
}
