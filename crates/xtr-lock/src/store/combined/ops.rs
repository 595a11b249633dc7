//! The quorum operations: each asks every member at once and feeds their typed answers to one
//! [`Tally`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::join_all;

use super::inflight::Pending;
use super::tally::{Tally, Verdict, Vote, most_telling};
use super::{CombinedStore, drift};
use crate::error::{Error, LostReason, Result};
use crate::key::{Key, Mode};
use crate::logging::TARGET;
use crate::store::{Acquired, Conflict, Holding, Saved, Store};

pub(super) async fn save_member(
    store: &Arc<dyn Store>,
    key: &Key,
    ttl: Option<Duration>,
    read: bool,
) -> Result<Saved> {
    if read && store.capabilities().shared {
        store.save_read(key, ttl).await
    } else {
        store.save(key, ttl).await
    }
}

/// What the members said about a save, beyond their votes.
#[derive(Default)]
struct SaveNotes {
    /// Members that granted, or failed (and so may have stored).
    changed: Vec<usize>,
    retry_after: Option<Duration>,
    /// What members that refused said the holder still holds there.
    kept: Option<Mode>,
    kept_by: usize,
}

impl SaveNotes {
    fn judge(&mut self, store: &CombinedStore, key: &Key, i: usize, answer: Result<Saved>) -> Vote {
        match answer {
            Ok(Saved::Acquired(_)) => {
                self.changed.push(i);
                Vote::Yes
            }
            Ok(Saved::Conflict(c)) => {
                if let Some(d) = c.retry_after {
                    self.retry_after = Some(self.retry_after.map_or(d, |r| r.min(d)));
                }
                if let Some(kept) = c.kept {
                    self.kept = Some(kept);
                    self.kept_by += 1;
                }
                Vote::No
            }
            Err(err) => {
                tracing::debug!(target: TARGET, resource = key.resource(),
                    store = %store.stores[i], error = %err, "one store failed to save the lock");
                self.changed.push(i);
                Vote::Failed
            }
        }
    }
}

impl CombinedStore {
    pub(super) async fn save_mode(
        &self,
        key: &Key,
        ttl: Option<Duration>,
        read: bool,
    ) -> Result<Saved> {
        let n = self.stores.len();
        if let Some(ttl) = ttl.filter(|_| self.expiring()) {
            key.reduce_lifetime(ttl.saturating_sub(drift(ttl)));
        }
        let mut pending = self
            .ask_all(key, move |s, k| async move {
                save_member(&s, &k, ttl, read).await
            })
            .await;
        let mut tally = Tally::new(self.strategy.as_ref(), n);
        let mut notes = SaveNotes::default();
        let verdict = tally
            .count(&mut pending, |i, answer| notes.judge(self, key, i, answer))
            .await;
        if verdict == Verdict::Met && !key.is_expired() {
            // The members still answering finish in the background: the holder's lease then
            // stands on all of them, not only on the quorum that answered first.
            self.detach(key, "save", &tally.answered, pending).await;
            return Ok(Saved::Acquired(Acquired::new()));
        }
        // Missed, or reached too late to be trusted (Redlock's validity): let every member
        // still answering finish first, so no late save lands after the roll-back.
        while let Some((i, answer)) = pending.next().await {
            notes.judge(self, key, i, answer);
        }
        if verdict == Verdict::Met || key.is_expired() {
            self.delete_everywhere(key).await;
            return Err(Error::expired(key.resource()).with_store(self));
        }
        tracing::info!(target: TARGET, resource = key.resource(), success = tally.yes,
            failure = tally.no + tally.failed, "failed to store the lock, the quorum was not met");
        let conflict = Conflict {
            retry_after: notes.retry_after,
            kept: None,
        };
        if let Some(mode) = notes.kept {
            // A refused mode change (a promotion): the holder held `mode` before. Put the members
            // that changed back, and keep it if a quorum holds it so.
            let restored = join_all(notes.changed.iter().map(|&i| {
                let store = self.stores[i].clone();
                async move { save_member(&store, key, ttl, mode == Mode::Read).await }
            }))
            .await;
            let back = restored
                .iter()
                .filter(|r| matches!(r, Ok(s) if s.is_acquired()))
                .count();
            if self.strategy.is_met(notes.kept_by + back, n) {
                return Ok(Saved::Conflict(Conflict {
                    kept: Some(mode),
                    ..conflict
                }));
            }
        }
        self.delete_everywhere(key).await;
        Ok(Saved::Conflict(conflict))
    }

    pub(super) async fn put_off(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        let n = self.stores.len();
        if self.expiring() {
            key.reduce_lifetime(ttl.saturating_sub(drift(ttl)));
        }
        let mut pending = self
            .ask_all(key, move |s, k| async move {
                s.put_off_expiration(&k, ttl).await
            })
            .await;
        let mut tally = Tally::new(self.strategy.as_ref(), n);
        let holding = self
            .count_holdings(key, &mut tally, &mut pending, "put off the expiration of")
            .await;
        if let Holding::NotHeld(reason) = holding {
            tracing::warn!(target: TARGET, resource = key.resource(), success = tally.yes,
                failure = tally.no + tally.failed,
                "failed to define the expiration of the lock, the quorum was not met");
            // Short of the quorum, the lock is taken back everywhere.
            self.roll_back(key, pending).await;
            if key.is_expired() {
                return Err(Error::expired(key.resource()).with_store(self));
            }
            return Ok(Holding::NotHeld(reason));
        }
        if key.is_expired() {
            self.roll_back(key, pending).await;
            return Err(Error::expired(key.resource()).with_store(self));
        }
        self.detach(key, "put_off", &tally.answered, pending).await;
        Ok(holding)
    }

    pub(super) async fn delete_quorum(&self, key: &Key) -> Result<bool> {
        let n = self.stores.len();
        let mut pending = self
            .ask_all(key, |s, k| async move { s.delete(&k).await })
            .await;
        let mut tally = Tally::new(self.strategy.as_ref(), n);
        let verdict = tally
            .count(&mut pending, |i, answer| match answer {
                Ok(true) => Vote::Yes,
                Ok(false) => Vote::No,
                Err(err) => {
                    tracing::warn!(target: TARGET, resource = key.resource(),
                        store = %self.stores[i], error = %err, "one store failed to delete the lock");
                    Vote::Failed
                }
            })
            .await;
        self.detach(key, "delete", &tally.answered, pending).await;
        Ok(verdict == Verdict::Met)
    }

    pub(super) async fn exists_quorum(&self, key: &Key) -> Result<Holding> {
        let n = self.stores.len();
        let mut pending = self
            .ask_all(key, |s, k| async move { s.exists(&k).await })
            .await;
        let mut tally = Tally::new(self.strategy.as_ref(), n);
        Ok(self
            .count_holdings(key, &mut tally, &mut pending, "check")
            .await)
    }

    /// Counts the members' answers on whether the holder holds until the quorum is decided:
    /// held, in the mode of [`mode_of`](Self::mode_of), or not held for the most telling reason
    /// members gave (unreachable if none gave one). `doing` names the request in the log line of
    /// a member that failed it.
    async fn count_holdings(
        &self,
        key: &Key,
        tally: &mut Tally<'_>,
        pending: &mut Pending<Holding>,
        doing: &str,
    ) -> Holding {
        let (mut writes, mut reasons) = (0, Vec::new());
        let verdict = tally
            .count(pending, |i, answer| match answer {
                Ok(Holding::Held(mode)) => {
                    writes += usize::from(mode == Mode::Write);
                    Vote::Yes
                }
                Ok(Holding::NotHeld(reason)) => {
                    reasons.push(reason);
                    Vote::No
                }
                Err(err) => {
                    tracing::debug!(target: TARGET, resource = key.resource(),
                        store = %self.stores[i], error = %err, "one store failed to {doing} the lock");
                    Vote::Failed
                }
            })
            .await;
        match verdict {
            Verdict::Met => Holding::Held(self.mode_of(writes)),
            _ => Holding::NotHeld(most_telling(&reasons).unwrap_or(LostReason::Unreachable)),
        }
    }

    /// The mode a holder holds in when `writes` of the members that agreed it holds say it
    /// writes: write only when they alone meet the strategy.
    fn mode_of(&self, writes: usize) -> Mode {
        if self.strategy.is_met(writes, self.stores.len()) {
            Mode::Write
        } else {
            Mode::Read
        }
    }
}
