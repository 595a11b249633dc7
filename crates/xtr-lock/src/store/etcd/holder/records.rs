//! The holder's records (`record.rs` has the layout): what its keys' values and records say,
//! and a re-save that changes its metadata in place.

use std::time::SystemTime;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::{Actor, Meta};
use crate::error::{LostReason, Result};
use crate::meta::HolderRecord;
use crate::store::etcd::queue::{self, Entry, Kind};
use crate::store::etcd::record;
use crate::store::{Acquired, Saved};

impl Actor {
    /// The metadata of the save under way, owned.
    pub(super) fn meta_vec(&self) -> Option<Vec<u8>> {
        self.meta.as_ref().map(|m| m.to_vec())
    }

    /// The record of the save under way, acquiring now (put by the read that grants).
    pub(super) fn new_record(&self) -> HolderRecord {
        HolderRecord::new(self.meta_vec(), SystemTime::now())
    }

    /// Writes the record of a grant that the granting read did not (see
    /// `record::put_if_granted`), with its token, if the key is still there. Best effort: the
    /// lock is held either way; a record left pending shows the holder as waiting.
    pub(super) async fn record_grant(&self, me: &Entry, record: &HolderRecord) {
        let txn = Txn::new()
            .when([Compare::create_revision(
                me.key.clone(),
                CompareOp::Equal,
                me.rev,
            )])
            .and_then([record::put(
                &self.core.config.prefix,
                &me.key,
                record,
                me.lease,
            )]);
        if let Err(e) = self.core.txn(txn).await {
            tracing::debug!(target: crate::logging::TARGET, resource = %self.resource,
                error = %e, "cannot record a grant; holders() shows the holder waiting");
        }
    }

    /// The value of a key of `kind` for the save under way: a reader's is `read`, a writer's
    /// its metadata, raw (checked not to be `read` before the save began).
    pub(super) fn value(&self, kind: Kind) -> Vec<u8> {
        match kind {
            Kind::Reader => queue::READER.to_vec(),
            Kind::Writer => self.meta.as_deref().map(<[u8]>::to_vec).unwrap_or_default(),
        }
    }

    /// A re-save of the held mode with other metadata: one transaction, if the key is still
    /// there, rewrites a writer's value (it keeps its place: a put keeps the create revision;
    /// `etcdctl elect -l` sees the new value, as after Go's `Proclaim`) and the record, which
    /// keeps when the holder acquired and now says the token it keeps. `None`: the key is
    /// gone, to be taken afresh.
    pub(super) async fn remeta(&mut self, meta: Option<Meta>) -> Option<Result<Saved>> {
        self.catch_up();
        let (entry, token, acquired_at) = self
            .held
            .as_ref()
            .map(|m| (m.entry.clone(), m.token, m.record.acquired_at))?;
        let record = HolderRecord::new(meta.as_ref().map(|m| m.to_vec()), acquired_at)
            .with_fencing_token(Some(token));
        let prefix = &self.core.config.prefix;
        let lease = Some(PutOptions::new().with_lease(entry.lease));
        let mut ops = vec![record::put(prefix, &entry.key, &record, entry.lease)];
        if entry.kind == Kind::Writer {
            let value = meta.as_deref().map(<[u8]>::to_vec).unwrap_or_default();
            ops.push(TxnOp::put(entry.key.clone(), value, lease));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.rev,
            )])
            .and_then(ops);
        match self.core.txn(txn).await {
            Ok(r) if r.succeeded() => {
                if let Some(m) = self.held.as_mut() {
                    m.record = record;
                }
                Some(Ok(Acquired::fenced(token).into()))
            }
            Ok(_) => {
                self.lose(LostReason::Removed);
                None
            }
            Err(e) => Some(Err(self.error(e))),
        }
    }
}
