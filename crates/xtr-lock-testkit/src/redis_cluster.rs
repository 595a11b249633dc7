//! Throwaway Redis Clusters: masters and replicas on free ports of 127.0.0.1, a node timeout of
//! one second so fail-overs take seconds, no persistence; nodes killed, paused, restarted,
//! failed over and resharded by fault tests; every process stopped on drop.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::time::Duration;

use crate::process::wait_for;
use crate::redis::RedisServer;
use crate::resp::{self, Reply, info_field};

mod nodes;
use nodes::{NodeView, crc16_xmodem, owner_of, parse_node_line};

/// The number of hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// `cluster-node-timeout`: how long a node stays unanswering before it is suspected. Short,
/// so that a fail-over takes about two seconds, yet long enough that a loaded 2-core machine
/// does not see nodes fail that merely answer late.
const NODE_TIMEOUT_MS: u32 = 1000;

/// How long a start, a fail-over or a reshard may take before the helper gives up.
const WAIT: Duration = Duration::from_secs(30);

/// A Redis Cluster this test started. Dropping it kills every node and removes their
/// directories.
///
/// Nodes are named by their port. What the cluster looks like now (who is master, who owns a
/// slot) is asked of a node that is up each time, never remembered: fail-overs change it.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas_per_master` replicas each (masters first in
    /// [`ports`](RedisCluster::ports), each master's replicas after them in the same order),
    /// the 16384 slots split evenly over the masters; returns once every node says
    /// `cluster_state:ok`, all agree on who serves which slot and every replica's link to its
    /// master is up. A 3+3 cluster takes about 2 s: a master says ok only 2 s after it started.
    ///
    /// Built with `CLUSTER ADDSLOTSRANGE`, `MEET` and `REPLICATE` rather than
    /// `redis-cli --cluster create`, which refuses fewer than 3 masters and sleeps a second.
    ///
    /// # Panics
    ///
    /// When `masters` is 0, `redis-server` is missing, or the cluster is not ready within 30 s
    /// (saying what it saw last).
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        assert!(masters >= 1, "a cluster has at least one master");
        // A port found free can be taken by another test before a node binds it: then the
        // cluster is started again on other ports (twice at most).
        for attempt in 1.. {
            match std::panic::catch_unwind(|| Self::try_start(masters, replicas_per_master)) {
                Ok(cluster) => return cluster,
                Err(panic) if attempt < 3 && crate::process::lost_a_port(&panic) => {}
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        unreachable!("the loop returns or panics")
    }

    fn try_start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        let n = masters * (1 + replicas_per_master);
        let ports = crate::redis::free_ports(n, Some(10000));
        let timeout = NODE_TIMEOUT_MS.to_string();
        let extra = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
            // Replicas always try to take over, however long their link was down (a paused
            // master, a slow machine): a test's fail-over must not depend on timing.
            "--cluster-replica-validity-factor",
            "0",
            // The shape a test made stays: no replica wanders to another master.
            "--cluster-allow-replica-migration",
            "no",
            // A replica's first sync starts at once, not after the 5 s a master waits by
            // default for more replicas to share a diskless transfer.
            "--repl-diskless-sync-delay",
            "0",
        ];
        let mut nodes = Vec::with_capacity(n);
        for &port in &ports {
            nodes.push(RedisServer::start_custom(
                port,
                Vec::<OsString>::new(),
                &extra,
            ));
        }
        let cluster = RedisCluster { nodes };
        let ids: Vec<String> = ports.iter().map(|&p| cluster.node_id(p)).collect();
        let (first, last) = (usize::from(SLOTS) / masters, usize::from(SLOTS) % masters);
        let mut start = 0;
        for (i, &port) in ports.iter().enumerate().take(masters) {
            let end = start + first + usize::from(i < last) - 1;
            cluster.ok(
                port,
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &start.to_string(),
                    &end.to_string(),
                ],
            );
            start = end + 1;
        }
        // Distinct epochs, so no two masters start with the same one (as redis-cli does).
        for (i, &port) in ports.iter().enumerate() {
            cluster.ok(port, &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
        }
        for &port in &ports[1..] {
            let first = ports[0].to_string();
            cluster.ok(port, &["CLUSTER", "MEET", "127.0.0.1", &first]);
        }
        wait_for("every node to know every other", WAIT, || {
            ports.iter().try_for_each(|&p| {
                let views = cluster.views_of(p)?;
                let known = views.iter().filter(|v| !v.has("handshake")).count();
                if known == n {
                    Ok(())
                } else {
                    Err(format!("{p} knows {known} of {n} nodes"))
                }
            })
        });
        for (k, &port) in ports.iter().enumerate().skip(masters) {
            let master = &ids[(k - masters) / replicas_per_master];
            cluster.ok(port, &["CLUSTER", "REPLICATE", master]);
        }
        cluster.wait_healthy();
        cluster
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…`: the current masters, in port order.
    pub fn dsn(&self) -> String {
        let seeds: Vec<String> = self
            .masters()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// Every node's port, in start order (killed ones too).
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The masters the cluster counts now (not failed), in port order, as a node that is up
    /// sees it. A master killed a moment ago is still among them until the cluster marks it
    /// failed (about a second).
    pub fn masters(&self) -> Vec<u16> {
        self.counted_views()
            .iter()
            .filter(|v| v.has("master"))
            .map(|v| v.port)
            .collect()
    }

    /// The replicas the cluster counts now, in port order.
    pub fn replicas(&self) -> Vec<u16> {
        self.counted_views()
            .iter()
            .filter(|v| v.has("slave"))
            .map(|v| v.port)
            .collect()
    }

    /// The replicas of `master` the cluster counts now, in port order.
    pub fn replicas_of(&self, master: u16) -> Vec<u16> {
        let views = self.counted_views();
        let id = views
            .iter()
            .find(|v| v.port == master)
            .map(|v| v.id.clone());
        views
            .iter()
            .filter(|v| v.master.is_some() && v.master == id)
            .map(|v| v.port)
            .collect()
    }

    /// The hash slot of `key`: CRC16 (XMODEM) modulo 16384 of the key, or of its hash tag
    /// (the bytes between its first `{` and the next `}`, when there is at least one).
    pub fn slot_of(key: &[u8]) -> u16 {
        let hashed = key
            .iter()
            .position(|&b| b == b'{')
            .and_then(|open| {
                let rest = &key[open + 1..];
                let close = rest.iter().position(|&b| b == b'}')?;
                (close > 0).then(|| &rest[..close])
            })
            .unwrap_or(key);
        crc16_xmodem(hashed) % SLOTS
    }

    /// The port of the master serving `slot` now, as a node that is up sees it.
    ///
    /// # Panics
    ///
    /// When no counted master serves it (its master failed, not yet replaced).
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        let views = self.counted_views();
        owner_of(&views, slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}; the cluster says {views:?}"))
    }

    /// SIGKILL to the node on `port`: it dies at once with its data (no persistence).
    pub fn kill(&mut self, port: u16) {
        self.node_mut(port).kill();
    }

    /// SIGSTOP to the node on `port`: it keeps its connections but answers nothing; after
    /// the node timeout (1 s) the others suspect it, and a paused master's replica takes
    /// over. Probes of this helper skip a paused node.
    pub fn pause(&self, port: u16) {
        self.node(port).pause();
    }

    /// SIGCONT after [`pause`](RedisCluster::pause). A master replaced meanwhile turns into a
    /// replica of its replacement by itself; [`wait_healthy`](RedisCluster::wait_healthy)
    /// waits for it.
    pub fn resume(&self, port: u16) {
        self.node(port).resume();
    }

    /// Starts the node on `port` again (after [`kill`](RedisCluster::kill), or killing it
    /// first), on the same port with the same node configuration (`nodes.conf`) but no data:
    /// it rejoins, as a replica when it was replaced meanwhile, an empty master otherwise.
    /// Returns once the cluster is healthy again (see
    /// [`wait_healthy`](RedisCluster::wait_healthy)).
    ///
    /// # Panics
    ///
    /// When it does not come up, or the cluster is not healthy within 30 s.
    pub fn restart(&mut self, port: u16) {
        self.node_mut(port).restart();
        self.wait_healthy();
    }

    /// Kills `master` and waits until one of its replicas was promoted in its place and the
    /// cluster is healthy again (about 2 s); returns the new master's port.
    ///
    /// # Panics
    ///
    /// When `master` is not a master, has no replica, the cluster has fewer than 3 masters
    /// (the remaining ones could not form the majority that elects a replica), or the
    /// fail-over is not over within 30 s.
    pub fn failover_by_killing(&mut self, master: u16) -> u16 {
        let masters = self.masters();
        assert!(
            masters.contains(&master),
            "{master} is not a master: {masters:?}"
        );
        assert!(
            masters.len() >= 3,
            "a fail-over needs a majority of masters left: {masters:?}"
        );
        let replicas = self.replicas_of(master);
        assert!(!replicas.is_empty(), "master {master} has no replica");
        self.kill(master);
        wait_for(
            &format!("a replica of {master} ({replicas:?}) to take over"),
            WAIT,
            || {
                self.health()?;
                let now = self.masters();
                replicas
                    .iter()
                    .copied()
                    .find(|r| now.contains(r))
                    .ok_or_else(|| format!("masters are {now:?}"))
            },
        )
    }

    /// `CLUSTER FAILOVER` on `replica`: it and its master swap roles without losing a write
    /// (the master stops, the replica catches up, then takes over). Returns once the cluster is
    /// healthy with `replica` as master and the former master replicating it.
    ///
    /// # Panics
    ///
    /// When `replica` is not a replica or the swap is not over within 30 s.
    pub fn manual_failover(&self, replica: u16) {
        let replicas = self.replicas();
        assert!(
            replicas.contains(&replica),
            "{replica} is not a replica: {replicas:?}"
        );
        self.ok(replica, &["CLUSTER", "FAILOVER"]);
        wait_for(&format!("{replica} to take over"), WAIT, || {
            self.health()?;
            let now = self.masters();
            now.contains(&replica)
                .then_some(())
                .ok_or_else(|| format!("masters are {now:?}"))
        });
    }

    /// Moves `count` slots served by `from` to `to`, with their keys (the first `count` slots
    /// `from` serves); returns them. See [`move_slots`](RedisCluster::move_slots).
    ///
    /// # Panics
    ///
    /// As [`move_slots`](RedisCluster::move_slots), and when `from` serves fewer slots.
    pub fn reshard(&self, count: usize, from: u16, to: u16) -> Vec<u16> {
        let views = self.counted_views();
        let served: Vec<u16> = views
            .iter()
            .filter(|v| v.port == from)
            .flat_map(|v| v.slots.iter().flat_map(|&(a, b)| a..=b))
            .take(count)
            .collect();
        assert_eq!(
            served.len(),
            count,
            "{from} serves fewer than {count} slots"
        );
        self.move_slots(&served, to);
        served
    }

    /// Moves each of `slots` to the master `to`, with its keys, the way a live cluster is
    /// resharded (`SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE` in batches, `SETSLOT NODE` on
    /// every master): clients that follow `ASK` and `MOVED` keep working meanwhile. Returns
    /// once every node agrees that `to` serves them. `Self::slot_of(key)` moves one key's slot.
    ///
    /// # Panics
    ///
    /// When `to` is not a master, a step is refused, or the nodes do not agree within 30 s.
    pub fn move_slots(&self, slots: &[u16], to: u16) {
        let to_id = self.node_id(to);
        for &slot in slots {
            let from = self.master_of_slot(slot);
            if from != to {
                self.move_slot(slot, from, to, &to_id);
            }
        }
        wait_for(
            &format!("every node to see {to} serve {slots:?}"),
            WAIT,
            || {
                self.health()?;
                let views = self.counted_views();
                match slots.iter().find(|&&s| owner_of(&views, s) != Some(to)) {
                    Some(s) => Err(format!("slot {s} is served by {:?}", owner_of(&views, *s))),
                    None => Ok(()),
                }
            },
        );
    }

    fn move_slot(&self, slot: u16, from: u16, to: u16, to_id: &str) {
        let from_id = self.node_id(from);
        let s = slot.to_string();
        self.ok(to, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]);
        self.ok(from, &["CLUSTER", "SETSLOT", &s, "MIGRATING", to_id]);
        let to_port = to.to_string();
        loop {
            let keys = resp::call(from, &[b"CLUSTER", b"GETKEYSINSLOT", s.as_bytes(), b"100"])
                .and_then(Reply::into_array)
                .unwrap_or_else(|e| panic!("keys of slot {slot} on {from}: {e}"));
            if keys.is_empty() {
                break;
            }
            let mut args: Vec<Vec<u8>> =
                ["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"]
                    .iter()
                    .map(|a| a.as_bytes().to_vec())
                    .collect();
            for key in keys {
                match key {
                    Reply::Bulk(Some(k)) => args.push(k),
                    other => panic!("a key of slot {slot} on {from}: {other:?}"),
                }
            }
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let reply = resp::call(from, &args).and_then(Reply::into_text);
            assert!(
                matches!(reply.as_deref(), Ok("OK" | "NOKEY")),
                "MIGRATE of slot {slot} from {from} to {to}: {reply:?}"
            );
        }
        // The new owner first, then the old, then the rest: the order the Redis docs ask for,
        // so no node sends a client back to a node that no longer has the slot.
        let mut order = vec![to, from];
        order.extend(
            self.masters()
                .into_iter()
                .filter(|p| *p != to && *p != from),
        );
        for port in order {
            self.ok(port, &["CLUSTER", "SETSLOT", &s, "NODE", to_id]);
        }
    }

    /// Waits until the cluster is healthy: every node that is up says `cluster_state:ok` with
    /// all 16384 slots served, they all see the same masters, replicas and slots (nodes
    /// killed or failed aside), and every replica whose master is up has its link up.
    ///
    /// # Panics
    ///
    /// When it is not within 30 s (a master paused or killed and not replaced never is),
    /// saying what it saw last.
    pub fn wait_healthy(&self) {
        wait_for("the cluster to be healthy", WAIT, || self.health());
    }

    /// Runs `redis-cli -p <port> <args>` (add `-c` to follow redirections), returning its
    /// output, trimmed. It hangs on a paused node.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        self.node(port).cli(args)
    }

    /// The node on `port`, for what the other methods do not cover.
    ///
    /// # Panics
    ///
    /// When no node of this cluster has that port.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node of this cluster on port {port}"))
    }

    fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node of this cluster on port {port}"))
    }

    fn up(&self) -> impl Iterator<Item = u16> + '_ {
        self.nodes
            .iter()
            .filter(|n| n.is_up())
            .map(RedisServer::port)
    }

    fn health(&self) -> Result<(), String> {
        let mut seen: Option<(u16, Vec<NodeView>)> = None;
        for port in self.up() {
            let info = resp::text(port, &["CLUSTER", "INFO"])?;
            for (field, want) in [
                ("cluster_state", "ok"),
                ("cluster_slots_assigned", "16384"),
                ("cluster_slots_ok", "16384"),
            ] {
                let got = info_field(&info, field);
                if got != Some(want) {
                    return Err(format!("{port} says {field}:{got:?}"));
                }
            }
            let views = self.agreed_views(port)?;
            match &seen {
                Some((first, theirs)) if *theirs != views => {
                    return Err(format!("{first} sees {theirs:?}, {port} sees {views:?}"));
                }
                Some(_) => {}
                None => seen = Some((port, views)),
            }
        }
        let (_, views) = seen.ok_or("no node is up")?;
        self.replicas_linked(&views)
    }

    /// What `port` sees of the nodes that are not killed and not failed, its own flags aside,
    /// sorted by port: what every node must see alike.
    fn agreed_views(&self, port: u16) -> Result<Vec<NodeView>, String> {
        let mut views = self.views_of(port)?;
        let killed: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| !n.is_running())
            .map(RedisServer::port)
            .collect();
        views.retain(|v| !killed.contains(&v.port) && !v.has("fail"));
        for v in &mut views {
            v.flags.retain(|f| f != "myself");
        }
        if let Some(v) = views.iter().find(|v| !v.counted()) {
            return Err(format!("{port} sees {} as {:?}", v.port, v.flags));
        }
        let served: usize = views
            .iter()
            .flat_map(|v| &v.slots)
            .map(|&(a, b)| usize::from(b - a) + 1)
            .sum();
        if served != usize::from(SLOTS) {
            return Err(format!("{port} sees {served} slots served: {views:?}"));
        }
        views.sort_by_key(|v| v.port);
        Ok(views)
    }

    fn replicas_linked(&self, views: &[NodeView]) -> Result<(), String> {
        let port_of: BTreeMap<&str, u16> = views.iter().map(|v| (v.id.as_str(), v.port)).collect();
        for v in views.iter().filter(|v| v.has("slave")) {
            let master = v.master.as_deref().and_then(|m| port_of.get(m).copied());
            let master_up = master.is_some_and(|m| self.node(m).is_up());
            if !self.node(v.port).is_up() || !master_up {
                continue;
            }
            let info = resp::text(v.port, &["INFO", "replication"])?;
            let link = info_field(&info, "master_link_status");
            let follows = info_field(&info, "master_port").and_then(|p| p.parse().ok());
            if link != Some("up") || follows != master {
                return Err(format!(
                    "replica {} follows {follows:?}, link {link:?}",
                    v.port
                ));
            }
        }
        Ok(())
    }

    /// `CLUSTER NODES` as one node that is up sees it, counted nodes only.
    fn counted_views(&self) -> Vec<NodeView> {
        let mut last = String::from("no node is up");
        for port in self.up() {
            match self.views_of(port) {
                Ok(mut views) => {
                    views.retain(NodeView::counted);
                    views.sort_by_key(|v| v.port);
                    return views;
                }
                Err(e) => last = e,
            }
        }
        panic!("no node of the cluster answered CLUSTER NODES: {last}")
    }

    fn views_of(&self, port: u16) -> Result<Vec<NodeView>, String> {
        resp::text(port, &["CLUSTER", "NODES"])?
            .lines()
            .map(parse_node_line)
            .collect()
    }

    fn node_id(&self, port: u16) -> String {
        resp::text(port, &["CLUSTER", "MYID"]).unwrap_or_else(|e| panic!("CLUSTER MYID: {e}"))
    }

    /// Sends `args` to `port`, panicking unless the reply is `OK`.
    fn ok(&self, port: u16, args: &[&str]) {
        let reply = resp::text(port, args);
        assert!(
            reply.as_deref() == Ok("OK"),
            "{args:?} on {port}: {reply:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random names, many with braces in them, hash to the slot a real node computes.
    #[test]
    fn slot_of_agrees_with_cluster_keyslot() {
        use rand::Rng as _;
        let cluster = RedisCluster::start(1, 0);
        let port = cluster.ports()[0];
        let mut rng = rand::rng();
        let alphabet = b"{}{}ab\x00\xff-";
        for _ in 0..2000 {
            let len = rng.random_range(0..12);
            let key: Vec<u8> = (0..len)
                .map(|_| {
                    if rng.random_bool(0.7) {
                        alphabet[rng.random_range(0..alphabet.len())]
                    } else {
                        rng.random()
                    }
                })
                .collect();
            let real = resp::call(port, &[b"CLUSTER", b"KEYSLOT", &key]).unwrap();
            assert_eq!(
                real,
                Reply::Int(i64::from(RedisCluster::slot_of(&key))),
                "key {key:?}"
            );
        }
    }
}
