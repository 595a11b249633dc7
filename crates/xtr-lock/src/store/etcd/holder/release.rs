//! A release that leaves the holder's key to run out (a minimum hold's way out): the key
//! moves to a lease of its own that nobody keeps alive.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::Actor;
use crate::error::{LostReason, Result};
use crate::store::Holding;
use crate::store::etcd::record;

/// The ttl of the lease a released key runs out on: `after` in whole seconds, rounded up (at
/// least 1; etcd may grant more, its minimum ttl, which only keeps others out longer).
fn ttl_secs(after: Duration) -> i64 {
    i64::try_from(crate::clock::seconds_up(after).max(1)).unwrap_or(i64::MAX)
}

/// Puts `key` on `lease`, keeping its value (and its create revision: its place in the queue).
fn onto(key: Vec<u8>, lease: i64) -> TxnOp {
    let options = PutOptions::new().with_lease(lease).with_ignore_value();
    TxnOp::put(key, Vec::<u8>::new(), Some(options))
}

/// Moves `key` (created at `rev`) and its record, if it has one, onto `lease`, if the key is
/// still there.
fn move_onto(prefix: &str, key: &[u8], rev: i64, lease: i64) -> Txn {
    let rec = record::key(prefix, key);
    let record_there = Compare::create_revision(rec.clone(), CompareOp::Greater, 0);
    Txn::new()
        .when([Compare::create_revision(
            key.to_vec(),
            CompareOp::Equal,
            rev,
        )])
        .and_then([
            onto(key.to_vec(), lease),
            TxnOp::txn(Txn::new().when([record_there]).and_then([onto(rec, lease)])),
        ])
}

impl Actor {
    /// Moves the held key, and its record if it has one, onto a new lease of `after` (rounded
    /// up) in one transaction, only while the key is still the one this holder put (its create
    /// revision): the lock then ends on the cluster's clock when that lease does, with nobody
    /// keeping it alive. The holder lets go as after a release: its own lease, which holds
    /// nothing of its lock any more, is revoked once the command ends.
    pub(super) async fn release_after(&mut self, after: Duration) -> Result<Holding> {
        self.catch_up();
        let Some(held) = self.held.as_ref().map(|m| m.entry.clone()) else {
            return Ok(Holding::NotHeld(self.lost.unwrap_or(LostReason::Removed)));
        };
        let mode = super::mode_of(held.kind);
        let secs = ttl_secs(after);
        let granted = self
            .core
            .call("lease grant", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await
            .map_err(|e| self.error(e))?;
        let lease = granted.id();
        // etcd may grant more than asked (its minimum ttl).
        let granted_secs = u64::try_from(granted.ttl()).unwrap_or(0);
        let ttl = Duration::from_secs(granted_secs.max(secs.unsigned_abs()));
        let txn = move_onto(&self.core.config.prefix, &held.key, held.rev, lease);
        match self.core.txn(txn).await {
            Ok(r) if r.succeeded() => {
                // Dropped with its watch: the key is no longer this holder's (it is a new
                // holder now: nothing of it finds that key again).
                self.held = None;
                self.ended += 1;
                self.lost = None;
                self.publish();
                Ok(Holding::Held(mode))
            }
            Ok(_) => {
                // The new lease holds nothing.
                self.core.revoke(lease, ttl);
                Ok(Holding::NotHeld(self.found_gone()))
            }
            // The key may have moved or not: the caller releases it (by its create revision),
            // and the new lease, if it holds nothing, ends by itself soon.
            Err(e) => Err(self.error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ttl_secs;
    use std::time::Duration;

    #[test]
    fn the_lease_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_secs(2)), 2);
        assert_eq!(ttl_secs(Duration::from_millis(2001)), 3);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
        assert_eq!(ttl_secs(Duration::MAX), i64::MAX);
    }
}
