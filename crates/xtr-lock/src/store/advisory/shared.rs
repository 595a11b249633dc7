//! What both session-lock stores share: a session task per holder, found through the holder's
//! key, and the commands sent to it.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::conns::Conns;
use super::db::LockId;
use super::session::{self, Cmd, LeaseEnd, Life};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::store::sql::errors::said;
use crate::store::tasks::{self, Tasks};
use crate::store::{HandleOwner, Holding, LossWatcher, LostReason, Saved};

pub(super) struct Core {
    pub(super) conns: Arc<Conns>,
    pub(super) owner: HandleOwner,
    /// Host, port, database (and key mode): the store's `Display`, without credentials.
    pub(super) shown: Arc<str>,
}

/// What a holder keeps on its key: its session, started on its first acquire.
type Handle = Tasks<Cmd, Life>;

impl Core {
    pub(super) fn new(conns: Conns) -> Core {
        let shown: Arc<str> = conns.config.shown.clone().into();
        Core {
            conns: Arc::new(conns),
            owner: HandleOwner::new(),
            shown,
        }
    }

    /// The server's id of the session holding `key`'s lock, while it holds.
    pub(super) fn session_id(&self, key: &Key) -> Option<i64> {
        let life = key.existing_handle::<Handle>(self.owner)?.life()?;
        life.held?;
        life.pid
    }

    /// How long `key`'s lock certainly lasts if its holder goes silent now: the last round
    /// trip the server answered on the holder's session, plus how long the server keeps a
    /// silent client's session, less a margin. `None` when nothing is held; `Duration::MAX`
    /// while held on a server that never ends a silent client's session on its own.
    pub(super) fn lease_remaining(&self, key: &Key) -> Option<std::time::Duration> {
        let life = key.existing_handle::<Handle>(self.owner)?.life()?;
        life.held?;
        Some(match life.lease_end {
            LeaseEnd::Unconfirmed => std::time::Duration::ZERO,
            LeaseEnd::Never => std::time::Duration::MAX,
            LeaseEnd::At(end) => end.saturating_duration_since(std::time::Instant::now()),
        })
    }

    async fn ask<T>(
        &self,
        key: &Key,
        tx: mpsc::UnboundedSender<Cmd>,
        cmd: impl FnOnce(oneshot::Sender<Result<T>>) -> Cmd,
    ) -> Result<T> {
        tasks::ask(tx, cmd, || {
            Error::storage("the holder's session task stopped")
                .with_resource(key.resource())
                .with_store(&*self.shown)
        })
        .await
    }

    fn existing_sender(&self, key: &Key) -> Option<mpsc::UnboundedSender<Cmd>> {
        key.existing_handle::<Handle>(self.owner)?.existing_sender()
    }

    /// Takes `mode` on the holder's session (started on first use, locking `id`).
    pub(super) async fn save(
        &self,
        key: &Key,
        id: impl FnOnce() -> LockId,
        mode: Mode,
        wait: bool,
    ) -> Result<Saved> {
        key.mark_unserializable();
        let tx = key.handle::<Handle>(self.owner).sender(|| {
            session::start(
                self.conns.clone(),
                id(),
                key.resource().to_owned(),
                self.shown.clone(),
            )
        });
        self.ask(key, tx, |reply| Cmd::Save { mode, wait, reply })
            .await
    }

    pub(super) async fn delete(&self, key: &Key) -> Result<bool> {
        match self.existing_sender(key) {
            Some(tx) => self.ask(key, tx, |reply| Cmd::Release { reply }).await,
            None => Ok(false),
        }
    }

    pub(super) async fn exists(&self, key: &Key) -> Result<Holding> {
        match self.existing_sender(key) {
            Some(tx) => self.ask(key, tx, |reply| Cmd::Check { reply }).await,
            None => Ok(Holding::NotHeld(LostReason::Removed)),
        }
    }

    pub(super) fn watch_loss(&self, key: &Key) -> LossWatcher {
        match key.existing_handle::<Handle>(self.owner) {
            // A session task that is gone took its connection with it.
            Some(handle) => handle.loss_watcher(LostReason::Disconnected),
            None => LossWatcher::new(async { LostReason::Removed }),
        }
    }

    /// Runs an introspection query on the control pool, under the statement timeout.
    pub(super) async fn inspect<T>(
        &self,
        resource: &str,
        what: &str,
        query: impl std::future::Future<Output = std::result::Result<T, sqlx::Error>>,
    ) -> Result<T> {
        tokio::time::timeout(self.conns.config.statement_timeout, query)
            .await
            .map_err(|_| {
                Error::storage("cannot reach the database: no answer within the statement timeout")
                    .temporary()
            })
            .and_then(|r| {
                r.map_err(|e| match e {
                    sqlx::Error::PoolTimedOut => {
                        Error::storage("cannot connect to the database within the connect timeout")
                            .temporary()
                    }
                    e => Error::storage(format!("cannot read {what}: {}", said(&e))).temporary(),
                })
            })
            .map_err(|e| e.with_resource(resource).with_store(&*self.shown))
    }
}
