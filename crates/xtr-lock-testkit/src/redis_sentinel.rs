//! Throwaway Redis Sentinel groups: a master, a replica and three sentinels on free ports of
//! 127.0.0.1, quick to notice a dead master (1 s); servers killed, paused, restarted and
//! failed over by fault tests; every process stopped on drop.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::time::Duration;

use crate::process::wait_for;
use crate::redis::RedisServer;
use crate::resp::{self, Reply, info_field};

/// `down-after-milliseconds`: how long a master stays unanswering before a sentinel thinks it
/// down. Short, so that a fail-over takes a few seconds, yet long enough that a loaded 2-core
/// machine does not see a master die that merely answers late.
const DOWN_AFTER_MS: u32 = 1000;

/// `failover-timeout`: how long a fail-over may take before the sentinels try again (after
/// twice as long).
const FAILOVER_TIMEOUT_MS: u32 = 3000;

/// How long a start or a fail-over may take before the helper gives up.
const WAIT: Duration = Duration::from_secs(30);

/// A master, its replica and three sentinels (quorum 2) this test started. Dropping it kills
/// every process and removes their directories.
///
/// Servers and sentinels are named by their port. Who is master is asked of the sentinels
/// each time, never remembered: fail-overs change it.
#[derive(Debug)]
pub struct RedisSentinelGroup {
    name: String,
    /// The data servers: the first master, then its replica.
    servers: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    /// The sentinels' configuration files, which they rewrite as they learn.
    confs: tempfile::TempDir,
}

impl RedisSentinelGroup {
    /// Starts a master, one replica of it and three sentinels monitoring it as `master_name`
    /// with a quorum of 2; returns once every sentinel knows the master, the replica and the
    /// two other sentinels, and the replica's link is up (about 2 s: sentinels find each other
    /// through hello messages sent every 2 s).
    ///
    /// # Panics
    ///
    /// When `master_name` is empty or holds `/` or white space, `redis-server` is missing,
    /// or the group is not ready within 30 s (saying what it saw last).
    pub fn start(master_name: &str) -> RedisSentinelGroup {
        assert!(
            !master_name.is_empty()
                && !master_name.contains(|c: char| c == '/' || c.is_whitespace()),
            "a master name without '/' or white space, not {master_name:?}"
        );
        // A port found free can be taken by another test before a server binds it: then the
        // group is started again on other ports (twice at most).
        for attempt in 1.. {
            match std::panic::catch_unwind(|| Self::try_start(master_name)) {
                Ok(group) => return group,
                Err(panic) if attempt < 3 && crate::process::lost_a_port(&panic) => {}
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        unreachable!("the loop returns or panics")
    }

    fn try_start(name: &str) -> RedisSentinelGroup {
        let ports = crate::redis::free_ports(5, None);
        let confs = tempfile::Builder::new()
            .prefix("xtr-testkit-sentinel-")
            .tempdir()
            .expect("a temp dir for sentinel configurations");
        let servers: Vec<RedisServer> = ports[..2]
            .iter()
            // A replica's sync starts at once, not after the 5 s a master waits by default for
            // more replicas to share a diskless transfer.
            .map(|&p| {
                RedisServer::start_custom(p, Vec::new(), &["--repl-diskless-sync-delay", "0"])
            })
            .collect();
        let mut group = RedisSentinelGroup {
            name: name.to_owned(),
            servers,
            sentinels: Vec::new(),
            confs,
        };
        group.replicate(ports[1], ports[0]);
        for &port in &ports[2..] {
            let conf = group.confs.path().join(format!("sentinel-{port}.conf"));
            let text = format!(
                "sentinel monitor {name} 127.0.0.1 {master} 2\n\
                 sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n\
                 sentinel parallel-syncs {name} 1\n",
                master = ports[0]
            );
            std::fs::write(&conf, text).expect("a sentinel configuration");
            let leading = vec![OsString::from(conf), OsString::from("--sentinel")];
            group
                .sentinels
                .push(RedisServer::start_custom(port, leading, &[]));
        }
        group.wait_healthy();
        group
    }

    /// `redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/<master name>/0`.
    pub fn dsn(&self) -> String {
        let seeds: Vec<String> = self
            .sentinel_ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{}/0", seeds.join(","), self.name)
    }

    /// The name the sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.name
    }

    /// The sentinels' ports, in start order (killed ones too).
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(RedisServer::port).collect()
    }

    /// The data servers' ports (master and replica), in start order (killed ones too).
    pub fn server_ports(&self) -> Vec<u16> {
        self.servers.iter().map(RedisServer::port).collect()
    }

    /// The master's port, as the first sentinel that is up reports it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    ///
    /// # Panics
    ///
    /// When no sentinel is up or answers.
    pub fn master_port(&self) -> u16 {
        let mut last = String::from("no sentinel is up");
        for s in self.sentinels.iter().filter(|s| s.is_up()) {
            match self.master_of(s.port()) {
                Ok(port) => return port,
                Err(e) => last = e,
            }
        }
        panic!("no sentinel reported the master of {}: {last}", self.name)
    }

    /// The replicas the first sentinel that is up knows and reaches (`SENTINEL REPLICAS`,
    /// those not down or disconnected), in port order.
    ///
    /// # Panics
    ///
    /// When no sentinel is up or answers.
    pub fn replica_ports(&self) -> Vec<u16> {
        let s = self
            .sentinels
            .iter()
            .find(|s| s.is_up())
            .expect("a sentinel that is up");
        let mut ports: Vec<u16> = self
            .replicas_seen_by(s.port())
            .unwrap_or_else(|e| panic!("SENTINEL REPLICAS: {e}"))
            .into_iter()
            .filter(|(_, flags)| flags == "slave")
            .map(|(port, _)| port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// Kills the current master and waits until the sentinels promoted the replica and all
    /// report its address (about 3 s); returns it. The dead master stays dead until
    /// [`restart`](RedisSentinelGroup::restart).
    ///
    /// # Panics
    ///
    /// When no replica is up, or the fail-over is not over within 30 s.
    pub fn kill_master(&mut self) -> u16 {
        let old = self.master_port();
        assert!(
            self.servers.iter().any(|s| s.port() != old && s.is_up()),
            "no replica is up to replace master {old}"
        );
        self.kill(old);
        wait_for(
            &format!("the sentinels to replace master {old}"),
            WAIT,
            || match self.health()? {
                new if new == old => Err(format!("the sentinels still report {old}")),
                new => Ok(new),
            },
        )
    }

    /// `SENTINEL FAILOVER`: the sentinels promote the replica while the master is alive.
    /// Returns the new master once every sentinel reports it, the former master replicates it
    /// and its link is up.
    ///
    /// The sentinels turn the former master into a replica only some 10 s after the switch
    /// (they wait for it to report its role again); this helper does it as soon as they all
    /// report the new master, as the sentinels would.
    ///
    /// # Panics
    ///
    /// When the sentinels refuse it or the swap is not over within 30 s.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        let sentinel = self.up_sentinel();
        wait_for("a sentinel to start a fail-over", WAIT, || {
            resp::text(sentinel, &["SENTINEL", "FAILOVER", &self.name]).map(drop)
        });
        let new = wait_for(&format!("the sentinels to replace {old}"), WAIT, || {
            self.agreed_master()?
                .filter(|&m| m != old)
                .ok_or_else(|| format!("the sentinels still report {old}"))
        });
        self.replicate(old, new);
        wait_for(&format!("{old} to replicate {new}"), WAIT, || {
            self.health()?;
            Ok(())
        });
        new
    }

    /// Starts the server or sentinel on `port` again (after [`kill`](RedisSentinelGroup::kill),
    /// or killing it first), on the same port. A data server comes back empty; when the
    /// sentinels report another master, it is made a replica of it at once (as a
    /// configuration rewritten by the sentinels would; left to them, it takes some 10 s). A
    /// sentinel keeps what it learnt (its configuration file). Returns once the group is
    /// healthy again.
    ///
    /// # Panics
    ///
    /// When it does not come up, or the group is not healthy within 30 s.
    pub fn restart(&mut self, port: u16) {
        self.server_mut(port).restart();
        if self.servers.iter().any(|s| s.port() == port) {
            let master = wait_for("the sentinels to agree on a master", WAIT, || {
                self.agreed_master()?
                    .ok_or_else(|| "no sentinel is up".to_owned())
            });
            if master != port {
                self.replicate(port, master);
            }
        }
        self.wait_healthy();
    }

    /// SIGKILL to the server or sentinel on `port`.
    pub fn kill(&mut self, port: u16) {
        self.server_mut(port).kill();
    }

    /// SIGSTOP to the server or sentinel on `port`: it keeps its connections but answers
    /// nothing; a master paused longer than 1 s is failed over (in about 3 s). A sentinel
    /// paused over 2 s goes into TILT mode for 30 s once resumed (it acts on nothing
    /// meanwhile).
    pub fn pause(&self, port: u16) {
        self.server(port).pause();
    }

    /// SIGCONT after [`pause`](RedisSentinelGroup::pause). A master replaced meanwhile still
    /// says it is master, and takes writes from clients that did not ask the sentinels, until
    /// they turn it into a replica some 10 s later (measured: 10.1 s);
    /// [`wait_healthy`](RedisSentinelGroup::wait_healthy) waits for that.
    pub fn resume(&self, port: u16) {
        self.server(port).resume();
    }

    /// Runs `redis-cli -p <port> <args>`, returning its output, trimmed. It hangs on a
    /// paused server.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        self.server(port).cli(args)
    }

    /// The server or sentinel on `port`, for what the other methods do not cover.
    ///
    /// # Panics
    ///
    /// When no process of this group has that port.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .chain(&self.sentinels)
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server of this group on port {port}"))
    }

    fn server_mut(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .chain(&mut self.sentinels)
            .find(|s| s.port() == port)
            .unwrap_or_else(|| panic!("no server of this group on port {port}"))
    }

    /// Waits until the group is healthy: every sentinel that is up reports the same master,
    /// sees it up, knows the two other sentinels and every data server that is up as a
    /// replica; the master says it is one and every other data server that is up replicates
    /// it with its link up.
    ///
    /// # Panics
    ///
    /// When it is not within 30 s, saying what it saw last.
    pub fn wait_healthy(&self) {
        wait_for("the sentinel group to be healthy", WAIT, || {
            self.health().map(drop)
        });
    }

    fn up_sentinel(&self) -> u16 {
        self.sentinels
            .iter()
            .find(|s| s.is_up())
            .map(RedisServer::port)
            .expect("a sentinel that is up")
    }

    /// The master every sentinel that is up reports; `Ok(None)` when none is up.
    fn agreed_master(&self) -> Result<Option<u16>, String> {
        let mut agreed = None;
        for s in self.sentinels.iter().filter(|s| s.is_up()) {
            let port = self.master_of(s.port())?;
            if agreed.is_some_and(|a| a != port) {
                return Err(format!("sentinels report {agreed:?} and {port}"));
            }
            agreed = Some(port);
        }
        Ok(agreed)
    }

    /// The healthy group's master (see [`wait_healthy`](RedisSentinelGroup::wait_healthy)).
    fn health(&self) -> Result<u16, String> {
        let master = self.agreed_master()?.ok_or("no sentinel is up")?;
        let replicas: Vec<u16> = self
            .servers
            .iter()
            .filter(|s| s.is_up() && s.port() != master)
            .map(RedisServer::port)
            .collect();
        for s in self.sentinels.iter().filter(|s| s.is_up()) {
            let s = s.port();
            let fields = fields(self.sentinel(s, &["MASTER"])?)?;
            let field = |f: &str| fields.get(f).map_or("", String::as_str);
            let others = (self.sentinels.len() - 1).to_string();
            if field("flags") != "master" || field("num-other-sentinels") != others {
                return Err(format!("sentinel {s} sees the master as {fields:?}"));
            }
            let seen = self.replicas_seen_by(s)?;
            for r in &replicas {
                if !seen.iter().any(|(p, flags)| p == r && flags == "slave") {
                    return Err(format!("sentinel {s} sees replicas {seen:?}, not {r}"));
                }
            }
        }
        let info = resp::text(master, &["INFO", "replication"])?;
        if info_field(&info, "role") != Some("master") {
            return Err(format!("the sentinels' master {master} says {info}"));
        }
        for r in replicas {
            let info = resp::text(r, &["INFO", "replication"])?;
            let follows = info_field(&info, "master_port").and_then(|p| p.parse::<u16>().ok());
            let link = info_field(&info, "master_link_status");
            if follows != Some(master) || link != Some("up") {
                return Err(format!(
                    "{r} follows {follows:?}, link {link:?}, not {master}"
                ));
            }
        }
        Ok(master)
    }

    fn master_of(&self, sentinel: u16) -> Result<u16, String> {
        let addr = self
            .sentinel(sentinel, &["GET-MASTER-ADDR-BY-NAME"])?
            .into_array()?;
        match addr.as_slice() {
            [_, Reply::Bulk(Some(port))] => String::from_utf8_lossy(port)
                .parse()
                .map_err(|e| format!("sentinel {sentinel}: a port: {e}")),
            other => Err(format!("sentinel {sentinel} reports {other:?}")),
        }
    }

    /// `(port, flags)` of each replica `sentinel` knows.
    fn replicas_seen_by(&self, sentinel: u16) -> Result<Vec<(u16, String)>, String> {
        self.sentinel(sentinel, &["REPLICAS"])?
            .into_array()?
            .into_iter()
            .map(|r| {
                let f = fields(r)?;
                let port = f.get("port").and_then(|p| p.parse().ok());
                let flags = f.get("flags").cloned().unwrap_or_default();
                port.map(|p| (p, flags))
                    .ok_or_else(|| format!("a replica without a port: {f:?}"))
            })
            .collect()
    }

    /// `SENTINEL <command> <master name>` on `sentinel`.
    fn sentinel(&self, sentinel: u16, command: &[&str]) -> Result<Reply, String> {
        let mut args: Vec<&[u8]> = vec![b"SENTINEL"];
        args.extend(command.iter().map(|c| c.as_bytes()));
        args.push(self.name.as_bytes());
        match resp::call(sentinel, &args)? {
            Reply::Error(e) => Err(format!("sentinel {sentinel}: {e}")),
            reply => Ok(reply),
        }
    }

    /// `REPLICAOF 127.0.0.1 <master>` on `replica`.
    fn replicate(&self, replica: u16, master: u16) {
        let reply = resp::text(replica, &["REPLICAOF", "127.0.0.1", &master.to_string()]);
        assert!(
            reply.as_deref().is_ok_and(|r| r.starts_with("OK")),
            "REPLICAOF on {replica}: {reply:?}"
        );
    }
}

/// A sentinel's `field, value, field, value, …` array as a map.
fn fields(reply: Reply) -> Result<BTreeMap<String, String>, String> {
    let items = reply.into_array()?;
    let text: Vec<String> = items
        .into_iter()
        .map(Reply::into_text)
        .collect::<Result<_, _>>()?;
    Ok(text
        .chunks_exact(2)
        .map(|kv| (kv[0].clone(), kv[1].clone()))
        .collect())
}
