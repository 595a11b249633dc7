//! Queueing a key and waiting for its turn: a lock's key waits for the key before it, a
//! semaphore's for the keys before it to give back the permits it lacks.

use std::time::Duration;

use tokio::sync::oneshot;

use super::{Actor, Mine, Read, token};
use crate::error::{Error, Result};
use crate::key::Mode;
use crate::meta::HolderRecord;
use crate::store::etcd::queue::{self, Entry, Place};
use crate::store::etcd::semaphore;
use crate::store::{Acquired, Conflict, Saved};

impl Actor {
    /// Puts a key of `mode` in the queue (a promotion's writer key beside the read key) and
    /// waits until it is first, or gives up at once when `wait` is false. `None`: the caller left
    /// and nothing is to be answered. A key that does not hold is deleted again (with its lease
    /// when nothing else is held on it: between commands).
    pub(super) async fn enqueue(
        &mut self,
        mode: Mode,
        wait: bool,
        ttl: Duration,
        reply: &mut oneshot::Sender<Result<Saved>>,
    ) -> Option<Result<Saved>> {
        let promoting = self.holds() == Some(Mode::Read);
        let kept = promoting.then_some(Mode::Read);
        let (mut me, mut read) = match self.put(mode, ttl).await {
            Ok(v) => v,
            Err(e) => return Some(Err(e)),
        };
        loop {
            let own = self.own_leases();
            let place = match self.permits {
                Some(permits) => semaphore::place(&read.queue, &me, &own, permits),
                None => queue::place(&read.queue, &me, &own, promoting),
            };
            let waited = match place {
                Place::Mine => {
                    if reply.is_closed() {
                        // Nobody will receive the grant: give it back.
                        self.drop_key(&me).await;
                        return None;
                    }
                    match self.unconfirmed(&me, promoting, reply).await {
                        None => return Some(self.take_grant(me, &read).await),
                        Some(waited) => waited,
                    }
                }
                Place::Deadlock => {
                    self.drop_key(&me).await;
                    return Some(if wait {
                        Err(self.error(Error::conflict(&self.resource).with_reason(
                            "deadlock: a writer queued before this promotion waits for this \
                             holder's read lock; the promotion gave way and the read lock is kept",
                        )))
                    } else {
                        Ok(Conflict::new().with_kept(kept).into())
                    });
                }
                Place::After(_) | Place::Short { .. } if !wait => {
                    self.drop_key(&me).await;
                    return Some(Ok(Conflict::new().with_kept(kept).into()));
                }
                waits => self.wait_for(&me, &waits, read.revision, reply).await,
            };
            match waited {
                Waited::Again(next) => read = next,
                Waited::Requeue => match self.requeue(mode, ttl, reply).await {
                    Some(Ok((again, next))) => (me, read) = (again, next),
                    Some(Err(e)) => return Some(Err(e)),
                    None => return None,
                },
                Waited::Left => {
                    self.drop_key(&me).await;
                    return None;
                }
                Waited::Lost => {
                    self.drop_key(&me).await;
                    return Some(Ok(Conflict::new().into()));
                }
                Waited::Failed(e) => {
                    self.drop_key(&me).await;
                    return Some(Err(e));
                }
            }
        }
    }

    /// The key is first in the queue as `read` found it: it holds. A semaphore's token is its
    /// key's create revision (unique per holder, several may be granted at one revision, and
    /// increasing in grant order, as the holders are always the queue's front); a lock's is
    /// the read's revision, recorded now where the read could not record the grant itself.
    async fn take_grant(&mut self, me: Entry, read: &Read) -> Result<Saved> {
        let seen = if self.permits.is_some() {
            me.rev
        } else {
            read.revision
        };
        if self.permits.is_none() && !read.recorded {
            let token = super::token(seen.max(me.rev));
            let record = read.record.clone().with_fencing_token(Some(token));
            self.record_grant(&me, &record).await;
        }
        self.granted(me, seen, read.record.clone()).await
    }

    /// The new key holds (seen at revision `seen_at`, by the read that put `record`): it
    /// replaces a read key it promoted, and its delete is watched.
    async fn granted(&mut self, me: Entry, seen_at: i64, record: HolderRecord) -> Result<Saved> {
        if let Some(old) = self.held.take() {
            // The promotion holds: the read key goes (its loss watch first). Until its delete
            // lands, it is this holder's own and blocks only others.
            let entry = old.entry.clone();
            drop(old);
            self.delete_or_keep(&entry).await;
        }
        let watch = crate::store::etcd::watch::loss(
            self.core.clone(),
            me.key.clone(),
            me.rev,
            self.lost_tx.clone(),
        );
        let at = token(seen_at.max(me.rev));
        self.held = Some(Mine {
            entry: me,
            token: at,
            record,
            watch: Some(watch),
        });
        self.lost = None;
        Ok(Acquired::fenced(at).into())
    }
}

/// How a wait for the predecessor ended.
pub(super) enum Waited {
    /// It changed (or may have): here is the queue read again.
    Again(Read),
    /// The waiting key went with its lease (or may have): queue again.
    Requeue,
    /// The caller gave up.
    Left,
    /// The read key of a promotion went: nothing is held any more.
    Lost,
    Failed(Error),
}
