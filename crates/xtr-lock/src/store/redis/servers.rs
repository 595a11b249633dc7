//! The servers a Redis store talks to (one, a cluster, or a master found through Sentinel),
//! and its command connection to them, one type for all three.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::topology::Topology;
use crate::mutex::lock;

/// The servers of a store.
pub(super) enum Servers {
    Single(redis::Client),
    Cluster {
        client: ClusterClient,
        /// The seed nodes (a subscriber connection is a client of its own).
        nodes: Vec<String>,
    },
    Sentinel(Sentinel),
}

/// A master found through Sentinel, found again when it stops answering as one.
pub(super) struct Sentinel {
    client: tokio::sync::Mutex<SentinelClient>,
    /// The master's client as last found (`None` once forgotten).
    master: Mutex<Option<redis::Client>>,
    /// The address of the master last found (kept when forgotten, to tell a new one).
    address: Mutex<Option<String>>,
    /// Counts the masters found that differ from the one before (a fail-over).
    pub(super) changes: tokio::sync::watch::Sender<u64>,
    /// The master's name.
    name: String,
    /// Whether a task listens for the sentinels' fail-over announcements (`failover.rs`).
    pub(super) listening: std::sync::atomic::AtomicBool,
}

impl Servers {
    /// The servers `topology` names (`url`: the one server's client URL); nothing is reached.
    pub(super) fn new(
        topology: &Topology,
        url: &str,
        connect_timeout: Option<Duration>,
        response_timeout: Option<Duration>,
    ) -> RedisResult<Servers> {
        Ok(match topology {
            Topology::Single => Servers::Single(redis::Client::open(url)?),
            Topology::Cluster { nodes } => Servers::Cluster {
                // As for one server (`conn.rs`): a request that writes may take up to the
                // landing bound past the response timeout before the connection gives up.
                client: cluster_client(
                    nodes,
                    connect_timeout,
                    response_timeout.map(|t| t * (1 + crate::serial::LANDING)),
                    None,
                )?,
                nodes: nodes.clone(),
            },
            Topology::Sentinel {
                sentinels,
                master,
                db,
                user,
                password,
                tls,
            } => {
                let mut node = redis::RedisConnectionInfo::default().set_db(i64::from(*db));
                if !user.is_empty() {
                    node = node.set_username(user);
                }
                if let Some(pw) = password {
                    node = node.set_password(pw);
                }
                let mut info =
                    SentinelNodeConnectionInfo::default().set_redis_connection_info(node);
                if *tls {
                    info = info.set_tls_mode(redis::TlsMode::Secure);
                }
                let client = SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect(),
                    master,
                    Some(info),
                    SentinelServerType::Master,
                )?;
                Servers::Sentinel(Sentinel {
                    client: tokio::sync::Mutex::new(client),
                    master: Mutex::new(None),
                    address: Mutex::new(None),
                    changes: tokio::sync::watch::Sender::new(0),
                    name: master.clone(),
                    listening: std::sync::atomic::AtomicBool::new(false),
                })
            }
        })
    }

    /// Whether this is a cluster.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Servers::Cluster { .. })
    }

    /// Opens a command connection.
    pub(super) async fn connect(&self, cfg: ConnectionManagerConfig) -> RedisResult<Conn> {
        match self {
            Servers::Single(client) => Ok(Conn::Single(
                ConnectionManager::new_with_config(client.clone(), cfg).await?,
            )),
            Servers::Cluster { client, .. } => {
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
            Servers::Sentinel(sentinel) => {
                let client = sentinel.find_master().await?;
                Ok(Conn::Single(
                    ConnectionManager::new_with_config(client, cfg).await?,
                ))
            }
        }
    }

    /// The client of the one server a subscriber connects to (the master, on Sentinel);
    /// `None` on a cluster, whose subscribers are cluster connections.
    pub(super) async fn subscriber_client(&self) -> RedisResult<Option<redis::Client>> {
        match self {
            Servers::Single(client) => Ok(Some(client.clone())),
            Servers::Cluster { .. } => Ok(None),
            Servers::Sentinel(sentinel) => {
                let known = lock(&sentinel.master).clone();
                match known {
                    Some(client) => Ok(Some(client)),
                    None => sentinel.find_master().await.map(Some),
                }
            }
        }
    }

    /// A cluster client whose connections send pushes (sharded messages) to `push`.
    pub(super) fn cluster_subscriber(
        &self,
        connect_timeout: Option<Duration>,
        push: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
    ) -> Option<RedisResult<ClusterClient>> {
        match self {
            Servers::Cluster { nodes, .. } => {
                Some(cluster_client(nodes, connect_timeout, None, Some(push)))
            }
            _ => None,
        }
    }

    /// The Sentinel state, if the master is found through Sentinel.
    pub(super) fn sentinel(&self) -> Option<&Sentinel> {
        match self {
            Servers::Sentinel(s) => Some(s),
            _ => None,
        }
    }
}

impl Sentinel {
    /// The master's name.
    pub(super) fn master_name(&self) -> &str {
        &self.name
    }

    /// A client of the first sentinel that answers as one.
    pub(super) async fn sentinel_client(&self) -> RedisResult<redis::Client> {
        self.client.lock().await.async_get_sentinel_client().await
    }

    /// Asks the sentinels for the master (checked to be one) and remembers it.
    pub(super) async fn find_master(&self) -> RedisResult<redis::Client> {
        let client = self.client.lock().await.async_get_client().await?;
        let addr = client.get_connection_info().addr().to_string();
        *lock(&self.master) = Some(client.clone());
        let before = lock(&self.address).replace(addr.clone());
        if before.is_some_and(|old| old != addr) {
            self.changes.send_modify(|n| *n += 1);
        }
        Ok(client)
    }

    /// Forgets the master, so the next connection asks the sentinels again.
    pub(super) fn forget(&self) {
        lock(&self.master).take();
    }
}

fn cluster_client(
    nodes: &[String],
    connect_timeout: Option<Duration>,
    response_timeout: Option<Duration>,
    push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>,
) -> RedisResult<ClusterClient> {
    let mut builder =
        ClusterClientBuilder::new(nodes.iter().map(String::as_str).collect::<Vec<_>>()).retries(3);
    if let Some(t) = connect_timeout {
        builder = builder.connection_timeout(t);
    }
    if let Some(t) = response_timeout {
        builder = builder.response_timeout(t);
    }
    if let Some(push) = push {
        builder = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(push);
    }
    builder.build()
}

/// A command connection: to one server (or Sentinel's master), or to a cluster.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Whether this is a cluster connection (whose pipelines must stay in one slot).
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// Runs `cmd` on the master of `slot` (a cluster), or on the one server.
    pub(super) async fn on_slot_master(&mut self, cmd: Cmd, slot: u16) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => {
                let route = Route::new(slot, SlotAddr::Master);
                c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
        }
    }

    /// The masters of a cluster as `(host, port)`, from `CLUSTER SLOTS`; one server is one
    /// entry whose address `on_node` ignores.
    pub(super) async fn masters(&mut self) -> RedisResult<Vec<(String, u16)>> {
        let Conn::Cluster(c) = self else {
            return Ok(vec![(String::new(), 0)]);
        };
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let slots = c
            .route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), route)
            .await?;
        let ranges: Vec<Vec<Value>> = redis::from_redis_value(slots)?;
        let mut masters: Vec<(String, u16)> = Vec::new();
        for range in ranges {
            let Some(master) = range.get(2) else { continue };
            let (host, port): (String, u16) = match master {
                Value::Array(node) if node.len() >= 2 => (
                    redis::from_redis_value(node[0].clone())?,
                    redis::from_redis_value(node[1].clone())?,
                ),
                _ => continue,
            };
            if !masters.contains(&(host.clone(), port)) {
                masters.push((host, port));
            }
        }
        Ok(masters)
    }

    /// Runs `cmd` on the node at `host:port` (a cluster), or on the one server.
    pub(super) async fn on_node(&mut self, cmd: Cmd, host: &str, port: u16) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => {
                let at = SingleNodeRoutingInfo::ByAddress {
                    host: host.to_owned(),
                    port,
                };
                c.route_command(cmd, RoutingInfo::SingleNode(at)).await
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
