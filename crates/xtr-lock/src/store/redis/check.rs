//! The pre-flight check of a Redis server ([`Store::check`](crate::Store::check)): what in its
//! set-up can drop a held lock. One node at a time, so that a cluster store can ask each of
//! its masters.
//!
//! Asked, in at most four round trips: `CONFIG GET maxmemory*` (eviction), `INFO` (its
//! replication, persistence, memory and cluster sections), `CONFIG GET save` (only without an
//! append-only file), and `CLUSTER INFO` / `CLUSTER NODES` on a cluster node. A question the
//! server refuses (a managed Redis renames `CONFIG`) is answered from `INFO` where it can be,
//! and is otherwise a warning that it could not be checked; a connection that fails is an
//! error.

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value};

use super::{Conn, RedisStore};
use crate::error::Result;
use crate::store::StoreWarning;

/// The warnings of one Redis node, unnamed (the caller names its store or node).
/// `wait_replicas`: how many replicas each write waits for, as the DSN asks (`None`: none).
pub(crate) async fn check_node<C: ConnectionLike + Send>(
    conn: &mut C,
    wait_replicas: Option<u32>,
) -> RedisResult<Vec<StoreWarning>> {
    let mut out = Vec::new();
    let config = refused_as_none(
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory*")
            .query_async::<HashMap<String, String>>(conn)
            .await,
    )?;
    let info = refused_as_none(redis::cmd("INFO").query_async::<String>(conn).await)?;
    let info = info.as_deref().map(fields).unwrap_or_default();
    out.extend(eviction(config.as_ref(), &info));
    if info.is_empty() {
        out.push(unchecked(
            "INFO",
            "replication, persistence and cluster state",
            "a fail-over to a replica, or a restart, can lose locks without anyone knowing",
        ));
        return Ok(out);
    }
    out.extend(replication(&info, wait_replicas));
    if info.get("aof_enabled").is_some_and(|v| *v == "0") && config.is_some() {
        let save = redis::cmd("CONFIG")
            .arg("GET")
            .arg("save")
            .query_async::<HashMap<String, String>>(conn)
            .await;
        if let Some(save) = refused_as_none(save)? {
            out.extend(persistence(&save));
        }
    }
    if info.get("cluster_enabled").is_some_and(|v| *v == "1") {
        out.extend(cluster(conn).await?);
    }
    Ok(out)
}

impl RedisStore {
    /// [`check_node`] on each master (the one server; a cluster's masters, each named), with
    /// the DSN's `wait_replicas`, within the response timeout; each warning names the store,
    /// and on a cluster the node.
    pub(super) async fn check_server(&self) -> Result<Vec<StoreWarning>> {
        let mut conn = self.conn().await?;
        let wait = self.inner.durability.as_ref().map(|d| d.replicas);
        let work = async {
            let masters = conn.masters().await?;
            let cluster = self.inner.servers.is_cluster();
            let mut out: Vec<StoreWarning> = Vec::new();
            let (mut answered, mut last_error) = (0, None);
            for (host, port) in masters {
                let label = if cluster {
                    format!("{self} (node {host}:{port})")
                } else {
                    self.to_string()
                };
                let mut node = Node {
                    conn: &mut conn,
                    host,
                    port,
                };
                let found = match check_node(&mut node, wait).await {
                    Ok(found) => found,
                    // A master of a cluster that cannot be asked is itself the warning (its
                    // slots are out of reach); the check fails only if no master answers.
                    Err(err) if cluster => {
                        out.push(
                            StoreWarning::new(
                                "cluster",
                                format!("the master {} cannot be asked: {err}", node.address()),
                                "its slots' locks cannot be taken or renewed, and a replica \
                                 promoted in its place lacks the locks it had not yet received",
                                "bring the node back, or check the cluster \
                                 (redis-cli --cluster check)",
                            )
                            .with_store(self),
                        );
                        last_error = Some(err);
                        continue;
                    }
                    Err(err) => return Err(err),
                };
                answered += 1;
                for w in found {
                    // The cluster's state is the same seen from every master: said once.
                    let said =
                        w.code() == "cluster" && out.iter().any(|o| o.problem() == w.problem());
                    if !said {
                        out.push(w.with_store(&label));
                    }
                }
            }
            match last_error {
                Some(err) if answered == 0 => Err(err),
                _ => Ok(out),
            }
        };
        self.read(work).await.map_err(|e| self.redis_error(e, None))
    }
}

impl Node<'_> {
    fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// One node as a connection: every command goes to it (the one server, or a cluster's node
/// at `host:port`). No pipelines: [`check_node`] sends none.
struct Node<'c> {
    conn: &'c mut Conn,
    host: String,
    port: u16,
}

impl ConnectionLike for Node<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.conn.on_node(cmd.clone(), &self.host, self.port))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a redis::Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async {
            Err(RedisError::from((
                ErrorKind::Client,
                "no pipelines in the pre-flight check",
            )))
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// Whether the server answered the question with a refusal (an unknown or renamed command, an
/// ACL that denies it), rather than failing to answer.
fn is_refusal(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::ResponseError | ServerErrorKind::NoPerm)
            | ErrorKind::Extension
    )
}

/// A refused question as `None`; other errors stay errors.
fn refused_as_none<T>(answer: RedisResult<T>) -> RedisResult<Option<T>> {
    match answer {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_refusal(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `INFO`'s `name:value` lines.
fn fields(info: &str) -> HashMap<String, String> {
    info.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.trim_end().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A question the server refused: nothing known of `what`, and why that matters.
fn unchecked(command: &str, what: &str, risk: &str) -> StoreWarning {
    StoreWarning::new(
        "unchecked",
        format!(
            "could not check {what}: the server refuses {command} (renamed or denied by an \
             ACL, as managed Redis services do)"
        ),
        risk.to_owned(),
        format!("check {what} in the service's settings yourself, or allow {command} to this user"),
    )
}

/// The eviction policy, from `CONFIG GET maxmemory*`, or else from `INFO`'s memory section.
fn eviction(
    config: Option<&HashMap<String, String>>,
    info: &HashMap<String, String>,
) -> Option<StoreWarning> {
    let from_config = config.and_then(|c| Some((c.get("maxmemory")?, c.get("maxmemory-policy")?)));
    let from_info = || Some((info.get("maxmemory")?, info.get("maxmemory_policy")?));
    let Some((limit, policy)) = from_config.or_else(from_info) else {
        return Some(unchecked(
            "CONFIG GET",
            "the eviction policy (maxmemory-policy)",
            "a policy that evicts keys under memory pressure drops locks while they are held",
        ));
    };
    // No limit: nothing is evicted, whatever the policy says.
    if limit.trim() == "0" {
        return None;
    }
    let risk = match policy.as_str() {
        "volatile-ttl" => {
            "under memory pressure Redis evicts the keys closest to expiring first, and locks are \
             such keys: a held lock can vanish and another holder take it"
        }
        p if p.starts_with("allkeys-") => {
            "under memory pressure Redis evicts any key, locks included: a held lock can vanish \
             and another holder take it"
        }
        p if p.starts_with("volatile-") => {
            "under memory pressure Redis evicts keys that have a ttl, and every lock has one: a \
             held lock can vanish and another holder take it"
        }
        _ => return None,
    };
    Some(StoreWarning::new(
        "eviction",
        format!("maxmemory-policy is {policy} with maxmemory set"),
        risk,
        "set maxmemory-policy noeviction (writes are then refused when memory runs out, and \
         an acquire fails instead of a lock vanishing), or keep locks on a server without \
         maxmemory",
    ))
}

/// A replica named by the DSN, or a master whose replicas a fail-over can promote.
fn replication(info: &HashMap<String, String>, wait_replicas: Option<u32>) -> Option<StoreWarning> {
    let role = info.get("role").map(String::as_str);
    if matches!(role, Some("slave" | "replica")) {
        return Some(StoreWarning::new(
            "replica",
            "the DSN names a replica (role:slave), not a master",
            "a replica refuses writes, so no lock can be taken on it; what it shows lags its \
             master",
            "point the DSN at the master",
        ));
    }
    let replicas: u32 = info.get("connected_slaves")?.parse().ok()?;
    match wait_replicas {
        None if replicas > 0 => Some(StoreWarning::new(
            "replication",
            format!("the server is a master with {replicas} connected replica(s)"),
            "a fail-over can promote a replica that had not yet received a lock written to the \
             master, and the lock is gone while its holder goes on",
            format!(
                "add ?wait_replicas={replicas} to the DSN (each write then waits for the \
                 replicas), or use a quorum of independent servers"
            ),
        )),
        Some(wanted) if wanted > replicas => Some(StoreWarning::new(
            "replication",
            format!(
                "wait_replicas is {wanted}, but the master has {replicas} connected replica(s)"
            ),
            "writes cannot be confirmed by that many replicas",
            "lower wait_replicas, or bring the replicas back",
        )),
        _ => None,
    }
}

/// No persistence (no append-only file, no snapshots): said as a note, many run Redis so on
/// purpose.
fn persistence(save: &HashMap<String, String>) -> Option<StoreWarning> {
    if !save.get("save").is_some_and(|s| s.trim().is_empty()) {
        return None;
    }
    Some(
        StoreWarning::new(
            "persistence",
            "the server keeps nothing on disk (appendonly no, save \"\")",
            "a restart empties it and every lock is gone while its holders go on (fencing \
             tokens still increase: they are seeded from the server's clock)",
            "turn on appendonly if a restart must keep locks, or restart the server only when \
             no lock is held",
        )
        .note(),
    )
}

/// A cluster node's view of the cluster: its state, and the nodes flagged failing.
async fn cluster<C: ConnectionLike + Send>(conn: &mut C) -> RedisResult<Vec<StoreWarning>> {
    let mut out = Vec::new();
    let info = refused_as_none(
        redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async::<String>(conn)
            .await,
    )?;
    let Some(info) = info else {
        return Ok(vec![unchecked(
            "CLUSTER INFO",
            "the cluster's state",
            "a cluster that is down or failing over can lose locks",
        )]);
    };
    let info = fields(&info);
    if let Some(state) = info.get("cluster_state").filter(|s| *s != "ok") {
        out.push(StoreWarning::new(
            "cluster",
            format!("the cluster's state is {state}"),
            "the cluster refuses requests (or some of its slots) until it is ok again, and a \
             fail-over under way can lose locks not yet replicated",
            "repair the cluster (redis-cli --cluster check) before relying on its locks",
        ));
    }
    let nodes = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async::<String>(conn)
        .await;
    if let Some(nodes) = refused_as_none(nodes)? {
        let failing = failing_nodes(&nodes);
        if !failing.is_empty() {
            out.push(StoreWarning::new(
                "cluster",
                format!("cluster nodes flagged failing: {}", failing.join(", ")),
                "a failing master's replica is promoted without the locks it had not yet \
                 received, and the master's slots are unavailable until then",
                "bring the nodes back or remove them (redis-cli --cluster check)",
            ));
        }
    }
    Ok(out)
}

/// The addresses (`host:port`) of the nodes `CLUSTER NODES` flags `fail` or `fail?`.
fn failing_nodes(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (_, addr, flags) = (parts.next()?, parts.next()?, parts.next()?);
            let failing = flags.split(',').any(|f| f == "fail" || f == "fail?");
            failing.then(|| addr.split('@').next().unwrap_or(addr).to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn eviction_is_judged_by_policy_and_limit() {
        let info = HashMap::new();
        let with = |policy| map(&[("maxmemory", "104857600"), ("maxmemory-policy", policy)]);
        for policy in [
            "allkeys-lru",
            "allkeys-random",
            "volatile-lfu",
            "volatile-ttl",
        ] {
            let w = eviction(Some(&with(policy)), &info).expect(policy);
            assert_eq!(w.code(), "eviction");
            assert!(w.problem().contains(policy), "{w}");
        }
        assert!(eviction(Some(&with("noeviction")), &info).is_none());
        let unlimited = map(&[("maxmemory", "0"), ("maxmemory-policy", "allkeys-lru")]);
        assert!(eviction(Some(&unlimited), &info).is_none());
        // CONFIG refused: INFO's memory section answers; without it, nothing is known.
        let info = map(&[("maxmemory", "1000"), ("maxmemory_policy", "allkeys-lfu")]);
        assert_eq!(eviction(None, &info).map(|w| w.code()), Some("eviction"));
        let unknown = eviction(None, &HashMap::new()).expect("unchecked");
        assert_eq!(unknown.code(), "unchecked");
    }

    #[test]
    fn replication_is_judged_by_role_and_wait() {
        let replica = map(&[("role", "slave"), ("connected_slaves", "0")]);
        assert_eq!(
            replication(&replica, None).map(|w| w.code()),
            Some("replica")
        );
        let master = map(&[("role", "master"), ("connected_slaves", "2")]);
        let w = replication(&master, None).expect("replicas without wait");
        assert!(w.remedy().contains("wait_replicas=2"), "{w}");
        assert!(replication(&master, Some(2)).is_none());
        assert!(replication(&master, Some(3)).is_some());
        let alone = map(&[("role", "master"), ("connected_slaves", "0")]);
        assert!(replication(&alone, None).is_none());
    }

    #[test]
    fn failing_nodes_are_named_by_address() {
        let nodes = "a 10.0.0.1:6379@16379 master - 0 0 1 connected 0-5460\n\
                     b 10.0.0.2:6379@16379 master,fail - 0 0 2 disconnected\n\
                     c 10.0.0.3:6379@16379 myself,slave,fail? a 0 0 3 connected\n";
        assert_eq!(failing_nodes(nodes), ["10.0.0.2:6379", "10.0.0.3:6379"]);
    }
}
