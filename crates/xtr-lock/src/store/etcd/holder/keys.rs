//! The holder's queue keys: putting one (with the queue read in the same transaction), and
//! deleting those that did not hold. A delete that does not land is never left to chance: a
//! key on a lease that holds nothing else goes with the lease (revoked between commands,
//! tried again until it lands), and one beside a held key is kept as stale and tried again
//! until it goes. Until then it is this holder's own: it blocks others, never the holder.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::{Actor, Read, kind_of, list_options, listed};
use crate::error::{Error, LostReason, Result};
use crate::key::Mode;
use crate::store::HolderRecord;
use crate::store::etcd::conn::lease_not_found;
use crate::store::etcd::queue::{self, Entry};
use crate::store::etcd::record;
use crate::store::etcd::semaphore;

/// The first and the longest pause between tries of the stale keys' deletes.
pub(super) const RETRY_FIRST: Duration = Duration::from_millis(100);
pub(super) const RETRY_MAX: Duration = Duration::from_secs(1);

/// A key of this holder's whose delete has not landed.
pub(super) struct Stale {
    pub(super) key: Vec<u8>,
    /// Its create revision when known (else it is matched by its lease: a put whose answer
    /// was lost).
    pub(super) rev: Option<i64>,
    pub(super) lease: i64,
}

impl Stale {
    /// Deletes the key, if it is still this one, and its record.
    fn delete(&self, prefix: &str) -> Txn {
        let when = match self.rev {
            Some(rev) => Compare::create_revision(self.key.clone(), CompareOp::Equal, rev),
            None => Compare::lease(self.key.clone(), CompareOp::Equal, self.lease),
        };
        Txn::new().when([when]).and_then([
            TxnOp::delete(self.key.clone(), None),
            record::delete(prefix, &self.key),
        ])
    }
}

impl Actor {
    /// Deletes the key of an attempt that did not hold. With nothing else held on its lease,
    /// the lease's revoke (between commands) takes it: nothing to send now.
    pub(super) async fn drop_key(&mut self, entry: &Entry) {
        if self.held.is_some() {
            self.delete_or_keep(entry).await;
        }
    }

    /// Deletes `entry` (only the key of that create revision), or keeps it as stale to try
    /// again.
    pub(super) async fn delete_or_keep(&mut self, entry: &Entry) {
        let stale = Stale {
            key: entry.key.clone(),
            rev: Some(entry.rev),
            lease: entry.lease,
        };
        if let Err(e) = self.core.txn(stale.delete(&self.core.config.prefix)).await {
            tracing::debug!(target: crate::logging::TARGET, resource = %self.resource,
                error = %e, "cannot delete a queue key of this holder's; trying again later");
            self.stale.push(stale);
        }
    }

    /// One try at every stale key's delete; those that land are forgotten.
    pub(super) async fn sweep(&mut self) {
        let mut left = Vec::new();
        for stale in std::mem::take(&mut self.stale) {
            if let Err(e) = self
                .core
                .txn_once(stale.delete(&self.core.config.prefix))
                .await
            {
                tracing::debug!(target: crate::logging::TARGET, resource = %self.resource,
                    error = %e, "cannot delete a stale queue key yet");
                left.push(stale);
            }
        }
        // Keys that went stale meanwhile stay too.
        left.append(&mut self.stale);
        self.stale = left;
    }

    /// Puts this holder's key of `mode` and reads the queue, in one transaction. A key of that
    /// name left by an earlier attempt whose answer was lost is this holder's (the name carries
    /// its lease): the put rewrites its value and keeps its place, so trying again is safe. A
    /// lease found gone is replaced once.
    pub(super) async fn put(&mut self, mode: Mode, ttl: Duration) -> Result<(Entry, Read)> {
        let mut again = true;
        loop {
            let lease = self.lease(ttl).await?;
            let kind = kind_of(mode);
            let taken = self.held.as_ref().map(|m| m.entry.key.clone());
            let key = queue::name(&self.dir, lease, kind, taken.as_deref());
            // The record goes in with the key, on its lease: a grant's when the queue
            // certainly grants it at once, else a waiter's.
            let record = self.new_record();
            let txn = self.put_txn(&key, kind, lease, &record);
            match self.core.txn(txn).await {
                Ok(r) => {
                    let revision = r.header().map_or(0, |h| h.revision());
                    let queue = listed(&self.dir, &r.op_responses());
                    if let Some(permits) = self.permits
                        && !semaphore::landed(&r)
                    {
                        return Err(semaphore::refused(&queue, permits, &self.resource)
                            .with_store(&*self.core.shown));
                    }
                    // A stale key of that name is this one again, adopted.
                    self.stale.retain(|s| s.key != key);
                    let Some(me) = queue.iter().find(|e| e.key == key).cloned() else {
                        return Err(self.error(Error::storage(
                            "the queue key vanished as it was put (its lease ended)",
                        )));
                    };
                    return Ok((
                        me,
                        Read {
                            queue,
                            revision,
                            recorded: record::granted_in(&r.op_responses()),
                            record,
                        },
                    ));
                }
                Err(e) if again && lease_not_found(&e) => {
                    again = false;
                    self.abandon_lease();
                    self.lose(LostReason::Expired);
                }
                Err(e) => {
                    self.unanswered_put(key, lease).await;
                    return Err(self.error(e));
                }
            }
        }
    }

    /// The transaction that puts this holder's key and its record and reads the queue.
    fn put_txn(&self, key: &[u8], kind: queue::Kind, lease: i64, record: &HolderRecord) -> Txn {
        let prefix = &self.core.config.prefix;
        let put_record = record::put(prefix, key, record, lease);
        match self.permits {
            // A semaphore's key goes in only beside keys of the same limit.
            Some(permits) => semaphore::put(
                &self.dir,
                key.to_vec(),
                permits,
                lease,
                (list_options(), put_record),
            ),
            None => Txn::new().and_then([
                TxnOp::put(
                    key.to_vec(),
                    self.value(kind),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(self.dir.clone(), Some(list_options())),
                record::put_if_granted(
                    &self.dir,
                    kind,
                    None,
                    put_record,
                    Some(record::put(
                        prefix,
                        key,
                        &record.clone().with_fencing_token(Some(record::PENDING)),
                        lease,
                    )),
                ),
            ]),
        }
    }

    /// After a put nobody answered: it may have happened. The key is this holder's (its name
    /// is never the held key's). Beside a held key it is taken back (or kept as stale); else
    /// it goes with the lease.
    async fn unanswered_put(&mut self, key: Vec<u8>, lease: i64) {
        if self.held.is_none() {
            return;
        }
        let stale = Stale {
            key,
            rev: None,
            lease,
        };
        if self
            .core
            .txn(stale.delete(&self.core.config.prefix))
            .await
            .is_err()
        {
            self.stale.push(stale);
        }
    }
}
