//! The store's one client (a gRPC channel balanced over the members, connected on first use),
//! and every request made through it: under the request timeout, with errors that say what
//! failed without echoing credentials.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::sync::Mutex;

use super::config::EtcdConfig;
use crate::error::{Error, Result};
use crate::key::HandleOwner;

pub(super) struct Core {
    pub(super) config: EtcdConfig,
    /// The store's name, without credentials.
    pub(super) shown: Arc<str>,
    pub(super) owner: HandleOwner,
    client: Mutex<Option<Client>>,
}

impl Core {
    pub(super) fn new(config: EtcdConfig) -> Core {
        Core {
            shown: config.shown.clone().into(),
            config,
            owner: HandleOwner::new(),
            client: Mutex::new(None),
        }
    }

    /// The client, connected on first use.
    pub(super) async fn client(&self) -> Result<Client> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            return Ok(client.clone());
        }
        let config = &self.config;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout)
            // A member cut off from its leader answers at once instead of hanging.
            .with_require_leader(true)
            .with_keep_alive(Duration::from_secs(10), config.request_timeout)
            .with_keep_alive_while_idle(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if let Some(files) = &config.tls {
            options = options.with_tls(tls_options(files).map_err(|e| self.fail(e))?);
        }
        let connect = Client::connect(config.endpoints.clone(), Some(options));
        let client = match tokio::time::timeout(config.connect_timeout, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(self.fail(failure("connect", e))),
            Err(_) => {
                return Err(self.fail(
                    Error::storage("cannot connect to etcd within the connect timeout")
                        .temporary(),
                ));
            }
        };
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Drops the client: the next request connects again.
    pub(super) async fn disconnect(&self) {
        self.client.lock().await.take();
    }

    /// Runs one request, `what` for errors, under the request timeout.
    pub(super) async fn call<T, F>(&self, what: &str, f: impl FnOnce(Client) -> F) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let client = self.client().await?;
        match tokio::time::timeout(self.config.request_timeout, f(client)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.fail(failure(what, e))),
            Err(_) => Err(self.fail(
                Error::storage(format!(
                    "etcd did not answer ({what}) within the request timeout ({:?})",
                    self.config.request_timeout
                ))
                .temporary(),
            )),
        }
    }

    /// `err` named after this store.
    pub(super) fn fail(&self, err: Error) -> Error {
        err.with_store(&*self.shown)
    }
}

/// Whether `err` says the lease is gone (expired or revoked) on the server.
pub(super) fn lease_not_found(err: &Error) -> bool {
    err.reason()
        .is_some_and(|r| r.contains("requested lease not found"))
        || err.to_string().contains("requested lease not found")
}

/// An etcd client error as this library's, temporary where trying again may help.
pub(super) fn failure(what: &str, err: etcd_client::Error) -> Error {
    use tonic_code::*;
    match &err {
        etcd_client::Error::GRpcStatus(status) => {
            let code = status.code() as i32;
            let msg = status.message();
            let e = Error::storage(format!("etcd refused {what}: {msg}"));
            match code {
                UNAVAILABLE | DEADLINE_EXCEEDED | ABORTED | RESOURCE_EXHAUSTED | UNKNOWN
                | CANCELLED | INTERNAL => Error::storage(format!("cannot reach etcd ({what}): {msg}"))
                    .temporary(),
                _ => e,
            }
        }
        etcd_client::Error::TransportError(e) => {
            Error::storage(format!("cannot reach etcd ({what}): {e}")).temporary()
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
