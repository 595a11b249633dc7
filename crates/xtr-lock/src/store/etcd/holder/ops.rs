//! The holder task's waits, checks and releases.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::sync::oneshot;

use super::enqueue::Waited;
use super::{Actor, Cmd, Read, list_options, listed};
use crate::error::{Error, LostReason, Result};
use crate::key::Mode;
use crate::store::etcd::conn::Core;
use crate::store::etcd::lease::lease_gone;
use crate::store::etcd::queue::{Entry, Place};
use crate::store::etcd::record;
use crate::store::etcd::watch;
use crate::store::{Conflict, Holding, Saved};

/// Until what `waits` waits for may have changed, from revision `from` on.
async fn turn(core: &Core, dir: &[u8], waits: &Place, from: i64) -> Result<()> {
    match waits {
        Place::After(before) => watch::changed(core, &before.key, from).await,
        Place::Short { ahead, need } => watch::freed(core, dir, ahead, *need, from).await,
        Place::Mine | Place::Deadlock => Ok(()),
    }
}

impl Actor {
    /// A command that came in while a wait is pending: answered now, except another wait,
    /// which is taken up after this one. A try that the held key does not grant is refused
    /// (granting it would need the waiting key's place).
    pub(super) async fn during_wait(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Save { wait: true, .. } => self.deferred.push_back(cmd),
            Cmd::Save {
                mode,
                wait: false,
                meta,
                reply,
                ..
            } => {
                let answer = if self.holds() == Some(mode) {
                    self.confirm(meta).await
                } else {
                    None
                };
                let answer = answer.unwrap_or_else(|| {
                    Ok(Conflict::new()
                        .with_kept(self.holds().filter(|m| *m == Mode::Read))
                        .into())
                });
                self.publish();
                let _ = reply.send(answer);
            }
            other => self.check_or_release(other).await,
        }
    }

    /// Waits until what `me` waits for (`waits`: the key before it, or the keys before a
    /// semaphore's key giving back enough permits) may have changed, then reads the queue
    /// again. Keeps its place through broken streams and leader changes, for as long as the
    /// lease lives.
    pub(super) async fn wait_for(
        &mut self,
        me: &Entry,
        waits: &Place,
        revision: i64,
        reply: &mut oneshot::Sender<Result<Saved>>,
    ) -> Waited {
        let mut pause = Duration::from_millis(50);
        let mut retry = super::keys::RETRY_FIRST;
        loop {
            let lease = self.lease.as_ref().map(|l| l.state.clone());
            let (core, dir) = (self.core.clone(), self.dir.clone());
            // A promotion holds a read lock on the lease: it is lost once the lease is not
            // confirmed. A plain wait holds nothing: it waits on while the lease may live (the
            // cluster paused or cut off), and queues again if it does not.
            let promoting = self.held.is_some();
            if lease.is_none() {
                // Given up meanwhile (a check found it gone): the key went with it.
                return Waited::Requeue;
            }
            let stale = !self.stale.is_empty();
            let changed = tokio::select! {
                // Biased: a caller that left is seen before a command sent after it left (the
                // lock's reconcile must find the wait's key already gone).
                biased;
                () = reply.closed() => return Waited::Left,
                r = turn(&core, &dir, waits, revision + 1) => r,
                () = lease_gone(lease, !promoting) => {
                    if !promoting {
                        return Waited::Requeue;
                    }
                    self.lease_ended();
                    return Waited::Failed(self.error(Error::lost(&self.resource, LostReason::Expired)
                        .with_reason("the lease ended while waiting (expired, revoked, or not confirmed in time)")));
                }
                () = tokio::time::sleep(retry), if stale => {
                    self.sweep().await;
                    retry = (retry * 2).min(super::keys::RETRY_MAX);
                    continue;
                }
                cmd = self.rx.recv() => {
                    let Some(cmd) = cmd else {
                        return Waited::Left;
                    };
                    self.during_wait(cmd).await;
                    continue;
                }
                Some((key, rev)) = self.lost_rx.recv() => {
                    let had = self.held.is_some();
                    self.key_deleted(&key, rev);
                    if had && self.held.is_none() {
                        // The read key of this promotion went: there is nothing to promote.
                        return Waited::Lost;
                    }
                    Ok(())
                }
            };
            if let Err(e) = changed {
                tracing::debug!(target: crate::logging::TARGET, resource = %self.resource,
                    error = %e, "a wait's watch broke; watching again");
                if self.pause(pause, reply).await {
                    return Waited::Left;
                }
                pause = (pause * 2).min(Duration::from_secs(1));
                continue;
            }
            if let Some(waited) = self.read_after_change(me, reply, &mut pause).await {
                return waited;
            }
        }
    }

    /// Reads the queue again once the key waited for changed: how the wait goes on, or `None`
    /// to watch again (the read failed, and `pause` was slept and doubled).
    async fn read_after_change(
        &mut self,
        me: &Entry,
        reply: &mut oneshot::Sender<Result<Saved>>,
        pause: &mut Duration,
    ) -> Option<Waited> {
        match self.reread(me).await {
            Ok(Some(read)) => Some(Waited::Again(read)),
            // Gone with its lease, or deleted: a plain wait queues again at the back.
            Ok(None) if self.held.is_none() => Some(Waited::Requeue),
            Ok(None) => Some(Waited::Failed(self.error(
                Error::expired(&self.resource).with_reason(
                    "the queue key vanished while it waited (its lease ended, or it \
                         was deleted): never a grant",
                ),
            ))),
            Err(e) => {
                tracing::debug!(target: crate::logging::TARGET, resource = %self.resource,
                    error = %e, "cannot read the queue while waiting; trying again");
                if self.pause(*pause, reply).await {
                    return Some(Waited::Left);
                }
                *pause = (*pause * 2).min(Duration::from_secs(1));
                None
            }
        }
    }

    /// The waiting key (not a promotion's) went with its lease, or may have: the lease is given
    /// up and the wait queues again at the back, with a new one, trying again (until the caller
    /// leaves) while the cluster does not answer. `None`: the caller left; an error: a
    /// semaphore's holders now use another limit.
    pub(super) async fn requeue(
        &mut self,
        mode: Mode,
        ttl: Duration,
        reply: &mut oneshot::Sender<Result<Saved>>,
    ) -> Option<Result<(Entry, Read)>> {
        tracing::info!(target: crate::logging::TARGET, resource = %self.resource,
            store = %self.core.shown, "the waiting key's lease ended; queueing again");
        self.abandon_lease();
        let mut pause = Duration::from_millis(50);
        loop {
            match self.put(mode, ttl).await {
                Ok(v) => return Some(Ok(v)),
                Err(e) if e.kind() == crate::ErrorKind::InvalidArgument => return Some(Err(e)),
                Err(e) => {
                    tracing::debug!(target: crate::logging::TARGET, resource = %self.resource,
                        error = %e, "cannot queue again yet; trying again");
                }
            }
            // A lease granted for a put that failed holds nothing: it goes.
            self.abandon_lease();
            if self.pause(pause, reply).await {
                return None;
            }
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Before `me` is taken for a grant: `None` when its lease is confirmed (a grant never
    /// starts on a lease that may have ended while the cluster did not answer), else what to do
    /// instead. A plain wait asks for a keep-alive until one is answered, then reads the queue
    /// again (its key still there) or queues again (its lease gone); a promotion's read lock
    /// is lost with the lease.
    pub(super) async fn unconfirmed(
        &mut self,
        me: &Entry,
        promoting: bool,
        reply: &mut oneshot::Sender<Result<Saved>>,
    ) -> Option<Waited> {
        let mut pause = Duration::from_millis(50);
        let mut asked = false;
        loop {
            let Some(lease) = self.lease.as_ref() else {
                return Some(Waited::Requeue);
            };
            if lease.alive() {
                if !asked {
                    return None;
                }
                // Confirmed after a while: the queue may have changed meanwhile.
                match self.reread(me).await {
                    Ok(Some(read)) => return Some(Waited::Again(read)),
                    Ok(None) => return Some(Waited::Requeue),
                    Err(_) if self.pause(pause, reply).await => return Some(Waited::Left),
                    Err(_) => {
                        pause = (pause * 2).min(Duration::from_secs(1));
                        continue;
                    }
                }
            }
            if promoting {
                self.lease_ended();
                return Some(Waited::Failed(
                    self.error(
                        Error::lost(&self.resource, LostReason::Expired)
                            .with_reason("the lease ended before the promotion was granted"),
                    ),
                ));
            }
            if lease.gone() {
                return Some(Waited::Requeue);
            }
            asked = true;
            let refreshed = tokio::select! {
                biased;
                () = reply.closed() => return Some(Waited::Left),
                r = lease.refresh() => r,
            };
            if refreshed.is_err() && self.pause(pause, reply).await {
                return Some(Waited::Left);
            }
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Sleeps `d`; true when the caller left meanwhile.
    pub(super) async fn pause(
        &self,
        d: Duration,
        reply: &mut oneshot::Sender<Result<Saved>>,
    ) -> bool {
        tokio::select! {
            () = tokio::time::sleep(d) => false,
            () = reply.closed() => true,
        }
    }

    /// The queue again, if `me` is still in it (the check the recipe lacked: a key that
    /// vanished while its holder waited is never taken for a place in the queue). When the
    /// queue certainly grants the key, the read also puts the grant's record: its revision is
    /// the grant's token, its time the grant's (a read that does not grant writes nothing).
    async fn reread(&self, me: &Entry) -> Result<Option<Read>> {
        let record = self.new_record();
        let put = record::put(&self.core.config.prefix, &me.key, &record, me.lease);
        let mut then = vec![TxnOp::get(self.dir.clone(), Some(list_options()))];
        if self.permits.is_none() {
            then.push(record::put_if_granted(
                &self.dir,
                me.kind,
                Some(me.rev),
                put,
                None,
            ));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                me.key.clone(),
                CompareOp::Equal,
                me.rev,
            )])
            .and_then(then);
        let r = self.core.txn(txn).await?;
        if !r.succeeded() {
            return Ok(None);
        }
        Ok(Some(Read {
            revision: r.header().map_or(0, |h| h.revision()),
            queue: listed(&self.dir, &r.op_responses()),
            recorded: record::granted_in(&r.op_responses()),
            record,
        }))
    }

    /// Whether the holder holds, asking etcd (and keeping the lease alive first if `refresh`).
    pub(super) async fn check(&mut self, refresh: bool) -> Result<Holding> {
        self.catch_up();
        let Some(held) = self.held.as_ref().map(|m| m.entry.clone()) else {
            return Ok(Holding::NotHeld(self.lost.unwrap_or(LostReason::Removed)));
        };
        if refresh
            && let Some(lease) = &self.lease
            && let Err(e) = lease.refresh().await
        {
            self.catch_up();
            if self.held.is_none() {
                return Ok(Holding::NotHeld(self.lost.unwrap_or(LostReason::Expired)));
            }
            return Err(self.error(e));
        }
        let key = held.key.clone();
        let got = self
            .core
            .get(&key, GetOptions::new())
            .await
            .map_err(|e| self.error(e))?;
        match got.kvs().iter().find(|kv| kv.create_revision() == held.rev) {
            Some(kv) => Ok(Holding::Held(super::mode_of(
                crate::store::etcd::queue::Kind::of(kv.value()),
            ))),
            None => Ok(Holding::NotHeld(self.found_gone())),
        }
    }

    /// Deletes the holder's key: true when it was still there (a live lock released).
    pub(super) async fn release(&mut self) -> Result<bool> {
        self.catch_up();
        let Some(held) = self.held.as_ref().map(|m| m.entry.clone()) else {
            return Ok(false);
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                held.key.clone(),
                CompareOp::Equal,
                held.rev,
            )])
            .and_then([
                TxnOp::delete(held.key.clone(), None),
                record::delete(&self.core.config.prefix, &held.key),
            ]);
        // The watch goes first, so this delete is not taken for a loss.
        if let Some(m) = self.held.as_mut()
            && let Some(w) = m.watch.take()
        {
            w.abort();
        }
        // Once first: a second try that finds the key gone cannot tell whether the first try
        // deleted it. When the first try is in doubt, the key is gone by the second and no
        // loss was seen before the release began, the first try is taken to have deleted it.
        let answer = match self.core.txn_once(txn.clone()).await {
            Err(e) if e.is_temporary() => self.core.txn(txn).await.map(|r| (r, true)),
            other => other.map(|r| (r, false)),
        };
        match answer {
            Ok((r, retried)) => {
                self.held = None;
                self.ended += 1;
                self.lost = None;
                self.publish();
                Ok(r.succeeded() || retried)
            }
            Err(e) => {
                // Unknown: the key may still be there; keep watching it.
                let watch = super::super::watch::loss(
                    self.core.clone(),
                    held.key,
                    held.rev,
                    self.lost_tx.clone(),
                );
                if let Some(m) = self.held.as_mut() {
                    m.watch = Some(watch);
                }
                Err(self.error(e))
            }
        }
    }
}
