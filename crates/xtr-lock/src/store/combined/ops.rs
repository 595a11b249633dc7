//! The quorum operations: each asks every member at once and feeds their typed answers to one
//! [`Tally`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;

use super::inflight::{Answer, Pending};
use super::lease::{renewed_holds, saved_holds};
use super::tally::{Tally, Verdict, Vote, most_telling};
use super::{CombinedStore, drift};
use crate::clock::BoxFuture;
use crate::error::{Error, LostReason, Result};
use crate::key::{Key, Mode};
use crate::logging::TARGET;
use crate::store::{Acquired, Conflict, Holding, Saved, Store};

/// What [`CombinedStore::count_holdings`] counts the answers to.
#[derive(Clone, Copy)]
enum Asked {
    /// A renewal (`put_off_expiration`).
    Renewal,
    /// A check (`exists`).
    Check,
}

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
    /// Those of `changed` that failed: whether they stored is not known.
    failed: Vec<usize>,
    retry_after: Option<Duration>,
    /// What members that refused said the holder still holds there.
    kept: Option<Mode>,
    kept_by: usize,
    /// The members' errors.
    failures: Vec<Error>,
}

impl SaveNotes {
    fn judge(&mut self, store: &CombinedStore, key: &Key, i: usize, answer: Result<Saved>) -> Vote {
        store.note(key, i, saved_holds(&answer));
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
                self.failed.push(i);
                self.failures.push(err);
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
        // Counting stops when the quorum is met, or when the members that refused are enough to
        // miss it: then the lock is held by someone else whatever the others answer, and a
        // paused member is not waited for. A miss that failures made is only decided when
        // every member has answered: until then a refusal could still make it a conflict.
        while let Some((i, answer)) = pending.next().await {
            let vote = notes.judge(self, key, i, answer);
            tally.add(i, vote);
            if tally.verdict() == Verdict::Met || !self.strategy.can_be_met(tally.no, n) {
                break;
            }
        }
        let verdict = tally.verdict();
        if verdict == Verdict::Met && !key.is_expired() {
            // The members still answering finish in the background: the holder's lease then
            // stands on all of them, not only on the quorum that answered first.
            self.detach_noted(key, "save", &tally.answered, pending, saved_holds)
                .await;
            return Ok(Saved::Acquired(Acquired::new()));
        }
        if verdict == Verdict::Met || key.is_expired() {
            // Reached too late to be trusted (Redlock's validity): everything is taken back.
            let rest = std::mem::take(&mut pending);
            self.protected(self.clone().roll_back_all(key.clone(), rest))
                .await;
            return Err(Error::expired(key.resource()).with_store(self));
        }
        self.quorum_missed(key, ttl, &tally, notes, pending).await
    }

    /// A save that missed the quorum: what the members stored is put back (a refused mode
    /// change) or taken back, and the answer is a conflict, or the outage when failures alone
    /// kept the quorum out of reach.
    async fn quorum_missed(
        &self,
        key: &Key,
        ttl: Option<Duration>,
        tally: &Tally<'_>,
        mut notes: SaveNotes,
        pending: Pending<Saved>,
    ) -> Result<Saved> {
        let n = self.stores.len();
        tracing::info!(target: TARGET, resource = key.resource(), success = tally.yes,
            refused = tally.no, failed = tally.failed,
            "failed to store the lock, the quorum was not met");
        let outage = self.strategy.can_be_met(tally.no, n);
        let conflict = Conflict {
            retry_after: notes.retry_after,
            kept: None,
        };
        let changed = std::mem::take(&mut notes.changed);
        let outcome = if let Some(mode) = notes.kept {
            // A refused mode change (a promotion): the holder held `mode` before. The members
            // that changed are put back, and it keeps `mode` if a quorum holds it so; else it is
            // taken back everywhere. Run to the end even if the caller is dropped: a half-done
            // restore would leave a minority lock behind.
            notes.changed = changed;
            let failures = std::mem::take(&mut notes.failures);
            let this = self.clone();
            let key2 = key.clone();
            let kept = self
                .protected(async move { this.restore(&key2, ttl, mode, notes, pending).await })
                .await;
            notes = SaveNotes {
                failures,
                ..SaveNotes::default()
            };
            if kept == Some(true) {
                Saved::Conflict(Conflict {
                    kept: Some(mode),
                    ..conflict
                })
            } else {
                Saved::Conflict(conflict)
            }
        } else {
            // Only the members that stored (or failed, and may have) are cleaned up; those that
            // failed, and those still answering, in the background (once they answer), ahead
            // of the holder's next request to them.
            self.roll_back_changed(key, &changed, &notes.failed, &tally.answered, pending)
                .await;
            Saved::Conflict(conflict)
        };
        if outage {
            return Err(self.outage(&notes.failures, n, tally.no));
        }
        Ok(outcome)
    }

    /// Puts the members that changed during a refused mode change back to `mode` (first letting
    /// the members still answering finish, so a late promotion is put back too): `true` when a
    /// quorum then holds `mode`. Otherwise the lock is taken back everywhere.
    async fn restore(
        &self,
        key: &Key,
        ttl: Option<Duration>,
        mode: Mode,
        mut notes: SaveNotes,
        mut pending: Pending<Saved>,
    ) -> bool {
        while let Some((i, answer)) = pending.next().await {
            notes.judge(self, key, i, answer);
        }
        let mut restored = self
            .ask(key, &notes.changed, move |s, k| async move {
                save_member(&s, &k, ttl, mode == Mode::Read).await
            })
            .await;
        let mut back = 0;
        while let Some((i, answer)) = restored.next().await {
            let holds = matches!(&answer, Ok(saved) if saved.is_acquired());
            self.note(key, i, holds);
            match answer {
                Ok(saved) if saved.is_acquired() => back += 1,
                Ok(_) => {}
                Err(err) => tracing::warn!(target: TARGET, resource = key.resource(),
                    store = %self.stores[i], error = %err,
                    "one store failed to put the lock back after a refused mode change"),
            }
        }
        if self
            .strategy
            .is_met(notes.kept_by + back, self.stores.len())
        {
            return true;
        }
        self.delete_everywhere(key).await;
        false
    }

    /// Takes a refused save back: deletes now from the members in `changed` that stored; in
    /// the background from those that `failed` (and may have stored: a member that failed is
    /// likely to fail again, and the verdict must not wait for a second timeout), and from each
    /// member still answering once it answers, if it stored or failed. Work in the background
    /// runs ahead of the holder's next request to that member.
    async fn roll_back_changed(
        &self,
        key: &Key,
        changed: &[usize],
        failed: &[usize],
        answered: &[bool],
        mut pending: Pending<Saved>,
    ) {
        for &i in changed {
            self.note(key, i, false);
        }
        if !failed.is_empty() {
            let uncertain = self
                .ask(key, failed, |s, k| async move { s.delete(&k).await })
                .await;
            self.inflight
                .detach(key.resource(), "delete", failed, uncertain)
                .await;
        }
        let stored: Vec<usize> = changed
            .iter()
            .copied()
            .filter(|i| !failed.contains(i))
            .collect();
        let mut deletes = self
            .ask(key, &stored, |s, k| async move { s.delete(&k).await })
            .await;
        while let Some((i, result)) = deletes.next().await {
            if let Err(err) = result {
                tracing::warn!(target: TARGET, resource = key.resource(),
                    store = %self.stores[i], error = %err, "one store failed to delete the lock");
            }
        }
        let unanswered: Vec<usize> = (0..answered.len()).filter(|&i| !answered[i]).collect();
        let Some(&first) = unanswered.first() else {
            return;
        };
        let (stores, owned) = (self.stores.clone(), key.clone());
        let inflight = self.inflight.clone();
        let cleanup: BoxFuture<'static, Answer<()>> = Box::pin(async move {
            while let Some((i, answer)) = pending.next().await {
                if matches!(answer, Ok(Saved::Conflict(_))) {
                    continue;
                }
                // A save given up on at the member's timeout lands first.
                inflight.landed(i, owned.resource()).await;
                if let Err(err) = stores[i].delete(&owned).await {
                    tracing::warn!(target: TARGET, resource = owned.resource(),
                        store = %stores[i], error = %err, "one store failed to delete the lock");
                }
            }
            (first, Ok(()))
        });
        let rest: Pending<()> = std::iter::once(cleanup).collect();
        self.inflight
            .detach(key.resource(), "delete", &unanswered, rest)
            .await;
    }

    /// Lets every member still answering finish, then deletes everywhere.
    async fn roll_back_all(self, key: Key, pending: Pending<Saved>) {
        self.roll_back(&key, pending).await;
    }

    /// The error of a quorum missed because members failed: how many, and each cause once.
    fn outage(&self, failures: &[Error], n: usize, refused: usize) -> Error {
        let mut causes: Vec<String> = Vec::new();
        for err in failures {
            let cause = err
                .reason()
                .map_or_else(|| err.kind().to_string(), str::to_owned);
            if !causes.contains(&cause) {
                causes.push(cause);
            }
        }
        let refused = match refused {
            0 => String::new(),
            r => format!(", {r} said someone else holds it"),
        };
        let err = Error::storage(format!(
            "the quorum was not reached: {} of {n} stores failed ({}){refused}",
            failures.len(),
            causes.join("; "),
        ))
        .with_store(self);
        // Worth retrying only if every failure may pass.
        if failures.iter().all(Error::is_temporary) {
            err.temporary()
        } else {
            err
        }
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
            .count_holdings(key, &mut tally, &mut pending, Asked::Renewal)
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
        self.detach_noted(key, "put_off", &tally.answered, pending, renewed_holds)
            .await;
        Ok(holding)
    }

    pub(super) async fn delete_quorum(&self, key: &Key) -> Result<bool> {
        self.forget(key);
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
            .count_holdings(key, &mut tally, &mut pending, Asked::Check)
            .await)
    }

    /// Counts the members' answers on whether the holder holds until the quorum is decided:
    /// held, in the mode of [`mode_of`](Self::mode_of), or not held for the most telling reason
    /// members gave (unreachable if none gave one). `doing` names the request in the log line of
    /// a member that failed it. Each answer is noted in the holder's record of the members it
    /// holds on: a renewal's answers count members in or out (a failed one out: it keeps its
    /// old expiry at best); a check only counts members out (its "held" says nothing of how
    /// long, after a renewal that failed there).
    async fn count_holdings(
        &self,
        key: &Key,
        tally: &mut Tally<'_>,
        pending: &mut Pending<Holding>,
        asked: Asked,
    ) -> Holding {
        let (mut writes, mut reasons) = (0, Vec::new());
        let verdict = tally
            .count(pending, |i, answer| match answer {
                Ok(Holding::Held(mode)) => {
                    if matches!(asked, Asked::Renewal) {
                        self.note(key, i, true);
                    }
                    writes += usize::from(mode == Mode::Write);
                    Vote::Yes
                }
                Ok(Holding::NotHeld(reason)) => {
                    self.note(key, i, false);
                    reasons.push(reason);
                    Vote::No
                }
                Err(err) => {
                    let doing = match asked {
                        Asked::Renewal => {
                            self.note(key, i, false);
                            "put off the expiration of"
                        }
                        Asked::Check => "check",
                    };
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
    pub(super) fn mode_of(&self, writes: usize) -> Mode {
        if self.strategy.is_met(writes, self.stores.len()) {
            Mode::Write
        } else {
            Mode::Read
        }
    }
}
