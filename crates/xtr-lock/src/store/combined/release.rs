//! A release that leaves the lock to run out on the members (a minimum hold's way out).

use std::time::Duration;

use futures_util::StreamExt as _;

use super::CombinedStore;
use super::tally::most_telling;
use crate::error::{LostReason, Result};
use crate::key::{Key, Mode};
use crate::logging::TARGET;
use crate::store::Holding;

/// What the members answered a release that lets the lock run out.
#[derive(Default)]
struct Answers {
    /// Members that leave the lock to run out.
    later: Vec<usize>,
    /// How many of those write.
    writes: usize,
    /// How many members cannot (they keep holding).
    cannot: usize,
    /// Why members that hold nothing do not.
    reasons: Vec<LostReason>,
}

impl CombinedStore {
    /// Asks every member at once to let the lock run out `after` from now, and waits for all
    /// of them. Members enough to meet the strategy did: the others (those that cannot,
    /// failed, or hold nothing) get a normal release, and the holder lets go. Members enough
    /// hold only with those that cannot: `None`, the lock keeps holding (its next renewal
    /// lengthens the others again). Otherwise the lock was lost: released everywhere.
    pub(super) async fn release_later(
        &self,
        key: &Key,
        after: Duration,
    ) -> Result<Option<Holding>> {
        let n = self.stores.len();
        let mut pending = self
            .ask_all(
                key,
                move |s, k| async move { s.release_after(&k, after).await },
            )
            .await;
        let mut got = Answers::default();
        while let Some((i, answer)) = pending.next().await {
            match answer {
                Ok(Some(Holding::Held(mode))) => {
                    got.later.push(i);
                    got.writes += usize::from(mode == Mode::Write);
                }
                Ok(None) => got.cannot += 1,
                Ok(Some(Holding::NotHeld(reason))) => got.reasons.push(reason),
                Err(err) => {
                    tracing::warn!(target: TARGET, resource = key.resource(),
                        store = %self.stores[i], error = %err,
                        "one store failed to let the lock run out");
                }
            }
        }
        if self.strategy.is_met(got.later.len(), n) {
            self.forget(key);
            let rest: Vec<usize> = (0..n).filter(|i| !got.later.contains(i)).collect();
            let mut deletes = self
                .ask(key, &rest, |s, k| async move { s.delete(&k).await })
                .await;
            while let Some((i, result)) = deletes.next().await {
                if let Err(err) = result {
                    tracing::warn!(target: TARGET, resource = key.resource(),
                        store = %self.stores[i], error = %err, "one store failed to delete the lock");
                }
            }
            return Ok(Some(Holding::Held(self.mode_of(got.writes))));
        }
        if got.cannot > 0 && self.strategy.is_met(got.later.len() + got.cannot, n) {
            return Ok(None);
        }
        self.delete_everywhere(key).await;
        let reason = most_telling(&got.reasons).unwrap_or(LostReason::Unreachable);
        Ok(Some(Holding::NotHeld(reason)))
    }
}
