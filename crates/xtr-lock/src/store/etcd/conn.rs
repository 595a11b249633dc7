//! The store's connections (a client per member, see [`members`](super::members)), and every
//! request made through them: under the request timeout, to a member that answers, with
//! errors that say what failed without echoing credentials.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, GetResponse, Txn, TxnResponse};
use std::collections::HashSet;

use tokio::sync::{Mutex, Notify};

use super::config::EtcdConfig;
use super::members::{Member, Members};
use crate::error::{Error, Result};
use crate::key::HandleOwner;
use crate::mutex::lock;
use crate::report::with_causes;
use std::error::Error as _;

/// HTTP/2 pings on every connection, so a member that stopped answering (paused, cut off) is
/// found in about two seconds: the requests it holds fail then, and the store's next ones go
/// to the others (see [`members`](super::members)).
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(1);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(1);

pub(super) struct Core {
    pub(super) config: EtcdConfig,
    /// The store's name, without credentials.
    pub(super) shown: Arc<str>,
    pub(super) owner: HandleOwner,
    /// The members, each with its client: set up on first use, dropped by `disconnect`.
    members: Mutex<Option<Arc<Members>>>,
    /// The leases being revoked (each by its own task), and a wake-up for `await_revokes`.
    revoking: std::sync::Mutex<HashSet<i64>>,
    revoked: Notify,
}

impl Core {
    pub(super) fn new(config: EtcdConfig) -> Core {
        Core {
            shown: config.shown.clone().into(),
            config,
            owner: HandleOwner::new(),
            members: Mutex::new(None),
            revoking: std::sync::Mutex::new(HashSet::new()),
            revoked: Notify::new(),
        }
    }

    /// Revokes lease `id` (granted with `ttl`) on a task of its own, tried again until etcd
    /// answers: revoked, or not found (it ended already). A partition does not leave its keys
    /// behind: the revoke lands once the cluster answers. It gives up when the lease has
    /// surely ended by itself (its ttl twice over, and a request's tries, since it began: no
    /// keep-alive is sent meanwhile). Without a runtime, the lease ends at its ttl.
    pub(super) fn revoke(self: &Arc<Self>, id: i64, ttl: Duration) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        lock(&self.revoking).insert(id);
        self.spawn_revoke(&rt, id, ttl);
    }

    /// Revokes lease `id` now (one try: its keys are gone when this returns `true`), and
    /// when that try fails, as [`revoke`](Core::revoke) does.
    pub(super) async fn revoke_now(self: &Arc<Self>, id: i64, ttl: Duration) -> bool {
        lock(&self.revoking).insert(id);
        let once = self
            .call_once(
                "lease revoke",
                |mut c| async move { c.lease_revoke(id).await },
            )
            .await;
        match once {
            Ok(_) => {}
            Err(e) if lease_not_found(&e) || !e.is_temporary() => {}
            Err(_) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    self.spawn_revoke(&rt, id, ttl);
                    return false;
                }
            }
        }
        lock(&self.revoking).remove(&id);
        self.revoked.notify_waiters();
        true
    }

    fn spawn_revoke(self: &Arc<Self>, rt: &tokio::runtime::Handle, id: i64, ttl: Duration) {
        let core = self.clone();
        rt.spawn(async move {
            let give_up = tokio::time::Instant::now() + ttl * 2 + core.config.request_timeout * 3;
            let mut pause = Duration::from_millis(50);
            loop {
                let revoked = core
                    .call(
                        "lease revoke",
                        |mut c| async move { c.lease_revoke(id).await },
                    )
                    .await;
                match revoked {
                    Ok(_) => break,
                    Err(e) if lease_not_found(&e) || !e.is_temporary() => break,
                    Err(e) if tokio::time::Instant::now() + pause >= give_up => {
                        tracing::debug!(target: crate::logging::TARGET, lease = %format!("{id:x}"),
                            error = %e, "cannot revoke a lease; it ends at its ttl");
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(target: crate::logging::TARGET, lease = %format!("{id:x}"),
                            error = %e, "cannot revoke a lease yet; trying again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                }
            }
            lock(&core.revoking).remove(&id);
            core.revoked.notify_waiters();
        });
    }

    /// Whether lease `id` is being revoked.
    pub(super) fn is_revoking(&self, id: i64) -> bool {
        lock(&self.revoking).contains(&id)
    }

    /// Waits until no revoke is under way, or `bound` has passed.
    pub(super) async fn await_revokes(&self, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let woken = self.revoked.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if lock(&self.revoking).is_empty() {
                return;
            }
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep_until(deadline) => return,
            }
        }
    }

    /// The members, set up on first use.
    async fn members(&self) -> Result<Arc<Members>> {
        let mut slot = self.members.lock().await;
        if let Some(members) = slot.as_ref() {
            return Ok(members.clone());
        }
        let config = &self.config;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout)
            // A member cut off from its leader answers at once instead of hanging.
            .with_require_leader(true)
            .with_keep_alive(HTTP2_PING_INTERVAL, HTTP2_PING_TIMEOUT)
            .with_keep_alive_while_idle(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if let Some(files) = &config.tls {
            options = options.with_tls(tls_options(files).map_err(|e| self.fail(e))?);
        }
        let members = Arc::new(Members::new(&config.endpoints, options, self.shown.clone()));
        *slot = Some(members.clone());
        Ok(members)
    }

    /// The member the next request goes to (see [`Members::order`]), connected on first use.
    /// One that cannot be connected to is left aside, and the next one tried.
    pub(super) async fn member(&self) -> Result<Member> {
        let members = self.members().await?;
        let mut failed = None;
        for at in members.order() {
            let connect = members.member(at);
            let err = match tokio::time::timeout(self.config.connect_timeout, connect).await {
                Ok(Ok(member)) => return Ok(member),
                Ok(Err(e)) => self.fail(failure("connect", e)),
                Err(_) => self.fail(
                    Error::storage("cannot connect to etcd within the connect timeout").temporary(),
                ),
            };
            if err.is_temporary() {
                members.silent(at);
            }
            failed = Some(err);
        }
        Err(failed.unwrap_or_else(|| self.fail(Error::invalid_argument("etcd: no member"))))
    }

    /// Drops the clients: the next request connects again.
    pub(super) async fn disconnect(&self) {
        self.members.lock().await.take();
    }

    /// Runs one request, `what` for errors, under the request timeout; tries it again (up to
    /// three times in all) when it failed in a way that another member may not (a member that
    /// stopped answering, a broken connection): on another member, as the one that failed is
    /// left aside. Only for requests that are safe to repeat, even when the first try lands
    /// late (a stopped member may read it when it resumes): reads, and writes whose
    /// transaction compares first.
    pub(super) async fn call<T: Send, F>(
        &self,
        what: &str,
        f: impl Fn(Client) -> F + Sync,
    ) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.call_once(what, &f).await {
                Err(e) if e.is_temporary() && tries < 3 => {
                    tracing::debug!(target: crate::logging::TARGET, store = %self.shown,
                        error = %e, "an etcd request failed; trying again");
                    tokio::time::sleep(Duration::from_millis(20 * tries)).await;
                }
                other => return other,
            }
        }
    }

    /// Runs one request once, under the request timeout. A member that fails it (temporary
    /// errors) is left aside: the caller's next request goes elsewhere.
    pub(super) async fn call_once<T: Send, F>(
        &self,
        what: &str,
        f: impl Fn(Client) -> F + Sync,
    ) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>> + Send,
    {
        let member = self.member().await?;
        let answer = tokio::time::timeout(self.config.request_timeout, f(member.client.clone()));
        match answer.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(member.failed(self.fail(failure(what, e)))),
            Err(_) => Err(member.failed(
                self.fail(
                    Error::storage(format!(
                        "etcd did not answer ({what}) within the request timeout ({:?})",
                        self.config.request_timeout
                    ))
                    .temporary(),
                ),
            )),
        }
    }

    /// A transaction that is safe to repeat (it compares first), tried up to three times.
    pub(super) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.call("txn", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// A transaction tried once: its answer must not be confused by an earlier try's effect.
    pub(super) async fn txn_once(&self, txn: Txn) -> Result<TxnResponse> {
        self.call_once("txn", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// A linearizable read of `key` (with `options`: a prefix, a count).
    pub(super) async fn get(&self, key: &[u8], options: GetOptions) -> Result<GetResponse> {
        self.call("get", |mut c| {
            let (key, options) = (key.to_vec(), options.clone());
            async move { c.get(key, Some(options)).await }
        })
        .await
    }

    /// `err` named after this store.
    pub(super) fn fail(&self, err: Error) -> Error {
        err.with_store(&*self.shown)
    }
}

/// Whether `err` says the lease is gone (expired or revoked) on the server.
pub(super) fn lease_not_found(err: &Error) -> bool {
    err.to_string().contains("requested lease not found")
}

/// An etcd client error as this library's, temporary where trying again may help.
pub(super) fn failure(what: &str, err: etcd_client::Error) -> Error {
    use tonic_code::*;
    match &err {
        etcd_client::Error::GRpcStatus(status) => {
            let code = status.code() as i32;
            // The status's message can hide its cause ("tcp connect error"): its sources say
            // it (the connection was refused).
            let msg = with_causes(status.message().to_owned(), status.source());
            let e = Error::storage(format!("etcd refused {what}: {msg}"));
            match code {
                UNAVAILABLE | DEADLINE_EXCEEDED | ABORTED | RESOURCE_EXHAUSTED | UNKNOWN
                | CANCELLED | INTERNAL => {
                    Error::storage(format!("cannot reach etcd ({what}): {msg}")).temporary()
                }
                _ => e,
            }
        }
        etcd_client::Error::TransportError(e) => {
            let said = with_causes(e.to_string(), e.source());
            Error::storage(format!("cannot reach etcd ({what}): {said}")).temporary()
        }
        etcd_client::Error::IoError(e) => {
            Error::storage(format!("cannot reach etcd ({what}): {e}")).temporary()
        }
        etcd_client::Error::InvalidArgs(e) | etcd_client::Error::EndpointError(e) => {
            Error::invalid_argument(format!("etcd: {e}"))
        }
        other => Error::storage(format!("etcd failed ({what}): {other}")).temporary(),
    }
}

/// gRPC status codes, as numbers (tonic is not a direct dependency).
mod tonic_code {
    pub(super) const CANCELLED: i32 = 1;
    pub(super) const UNKNOWN: i32 = 2;
    pub(super) const DEADLINE_EXCEEDED: i32 = 4;
    pub(super) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(super) const ABORTED: i32 = 10;
    pub(super) const INTERNAL: i32 = 13;
    pub(super) const UNAVAILABLE: i32 = 14;
}

fn tls_options(files: &super::config::TlsFiles) -> Result<etcd_client::TlsOptions> {
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            Error::invalid_argument(format!("cannot read the {what} {}: {e}", path.display()))
        })
    };
    let mut tls = etcd_client::TlsOptions::new();
    if let Some(ca) = &files.ca {
        tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read("ca_file", ca)?));
    }
    if let (Some(cert), Some(key)) = (&files.cert, &files.key) {
        tls = tls.identity(etcd_client::Identity::from_pem(
            read("cert_file", cert)?,
            read("key_file", key)?,
        ));
    }
    Ok(tls)
}
