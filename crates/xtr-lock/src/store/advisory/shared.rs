//! What both session-lock stores share: a session task per holder, found through the holder's
//! key, and the commands sent to it.

use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::conns::Conns;
use super::db::LockId;
use super::session::{self, Cmd, Life, Session};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::store::{HandleOwner, Holding, LossWatcher, LostReason, Saved};

pub(super) struct Core {
    pub(super) conns: Arc<Conns>,
    pub(super) owner: HandleOwner,
    /// Host, port, database (and key mode): the store's `Display`, without credentials.
    pub(super) shown: Arc<str>,
}

/// What a holder keeps on its key: its session, started on its first acquire.
#[derive(Default)]
struct Handle {
    session: Mutex<Option<Session>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

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
        let handle = key.existing_handle::<Handle>(self.owner)?;
        let guard = lock(&handle.session);
        let life = *guard.as_ref()?.life.borrow();
        life.held?;
        life.pid
    }

    fn sender(&self, key: &Key, id: impl FnOnce() -> LockId) -> mpsc::UnboundedSender<Cmd> {
        let handle = key.handle::<Handle>(self.owner);
        let mut guard = lock(&handle.session);
        match guard.as_ref() {
            Some(s) if !s.tx.is_closed() => s.tx.clone(),
            _ => {
                let session = session::start(
                    self.conns.clone(),
                    id(),
                    key.resource().to_owned(),
                    self.shown.clone(),
                );
                let tx = session.tx.clone();
                *guard = Some(session);
                tx
            }
        }
    }

    fn existing_sender(&self, key: &Key) -> Option<mpsc::UnboundedSender<Cmd>> {
        let handle = key.existing_handle::<Handle>(self.owner)?;
        let guard = lock(&handle.session);
        guard.as_ref().map(|s| s.tx.clone())
    }

    async fn ask<T>(
        &self,
        key: &Key,
        tx: mpsc::UnboundedSender<Cmd>,
        cmd: impl FnOnce(oneshot::Sender<Result<T>>) -> Cmd,
    ) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        let gone = || {
            Error::storage("the holder's session task stopped")
                .with_resource(key.resource())
                .with_store(&*self.shown)
        };
        tx.send(cmd(reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
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
        let tx = self.sender(key, id);
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
        let life = key
            .existing_handle::<Handle>(self.owner)
            .and_then(|h| lock(&h.session).as_ref().map(|s| s.life.clone()));
        let Some(mut life) = life else {
            return LossWatcher::new(async { LostReason::Removed });
        };
        let start = *life.borrow();
        LossWatcher::new(async move {
            loop {
                let now: Life = *life.borrow_and_update();
                if now.held.is_none() || now.ended != start.ended {
                    return now.lost.unwrap_or(LostReason::Removed);
                }
                if life.changed().await.is_err() {
                    // The session task is gone (its runtime ended): so is its connection.
                    return LostReason::Disconnected;
                }
            }
        })
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
                    e => Error::storage(format!("cannot read {what}: {e}")).temporary(),
                })
            })
            .map_err(|e| e.with_resource(resource).with_store(&*self.shown))
    }
}
