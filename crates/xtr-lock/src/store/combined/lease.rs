//! A quorum's lease: which members a holder holds on, as their last answers said, and the span
//! members enough to meet the strategy are certain to hold for.

use std::sync::Mutex;
use std::time::Duration;

use super::CombinedStore;
use super::inflight::{Answer, Pending};
use super::strategy::Strategy;
use crate::clock::BoxFuture;
use crate::error::Result;
use crate::key::Key;
use crate::mutex::lock;
use crate::store::{Holding, Saved, Store};

/// Per holder (a handle on its key): whether each member holds its lock, by that member's last
/// answer. A member counts only on an answer that it holds, to a save or a renewal (a refused
/// mode change where the holder keeps its old mode included); a refusal, a failed save or
/// renewal (it may have stored, or kept its old expiry), no answer by the time the quorum was
/// decided, a check that says it does not hold and a release each count it out, so the record
/// errs towards holding less than the members do, never more. Members on a lease keep their
/// own record ([`Store::lease_remaining`]); this one is for the others.
///
/// Each member's mark carries the number of answers recorded for it: an answer left to the
/// background is recorded only if nothing was recorded for that member since it was left
/// (a later request's answer, or its being counted out when a later quorum was decided
/// without it), so an old answer never overwrites a newer one.
#[derive(Default)]
pub(super) struct Members(Mutex<Vec<Mark>>);

/// One member's mark: whether it holds, and how many times it was recorded.
#[derive(Default, Clone, Copy)]
struct Mark {
    holds: bool,
    recorded: u64,
}

impl Members {
    fn with<T>(&self, f: impl FnOnce(&mut Vec<Mark>) -> T) -> T {
        f(&mut lock(&self.0))
    }

    fn holds(&self, i: usize) -> bool {
        self.with(|marks| marks.get(i).is_some_and(|m| m.holds))
    }

    /// Records member `i`'s answer; the number of records it then has.
    fn set(&self, i: usize, holds: bool) -> u64 {
        self.with(|marks| {
            if marks.len() <= i {
                marks.resize(i + 1, Mark::default());
            }
            marks[i].holds = holds;
            marks[i].recorded += 1;
            marks[i].recorded
        })
    }

    /// Records member `i`'s answer if it has `recorded` records still.
    fn set_if(&self, i: usize, holds: bool, recorded: u64) {
        self.with(|marks| {
            if let Some(mark) = marks.get_mut(i).filter(|m| m.recorded == recorded) {
                mark.holds = holds;
                mark.recorded += 1;
            }
        });
    }
}

/// Whether a member's answer to a save says the holder holds there (a refused mode change
/// where it keeps its old mode included).
pub(super) fn saved_holds(answer: &Result<Saved>) -> bool {
    match answer {
        Ok(Saved::Acquired(_)) => true,
        Ok(Saved::Conflict(c)) => c.kept.is_some(),
        Err(_) => false,
    }
}

/// Whether a member's answer to a renewal says the holder holds there.
pub(super) fn renewed_holds(answer: &Result<Holding>) -> bool {
    matches!(answer, Ok(Holding::Held(_)))
}

impl CombinedStore {
    /// Records member `i`'s answer on whether `key`'s holder holds there.
    pub(super) fn note(&self, key: &Key, i: usize, holds: bool) {
        key.handle::<Members>(self.owner).set(i, holds);
    }

    /// Leaves the members that had not answered when the quorum was decided to finish in the
    /// background (see [`detach`](CombinedStore::detach)), counted out until their answers
    /// come, which `holds` then reads: an answer may never come (a paused server).
    pub(super) async fn detach_noted<T: Send + 'static>(
        &self,
        key: &Key,
        what: &'static str,
        answered: &[bool],
        pending: Pending<T>,
        holds: fn(&Result<T>) -> bool,
    ) {
        let members = key.handle::<Members>(self.owner);
        let left: Vec<(usize, u64)> = (0..answered.len())
            .filter(|&i| !answered[i])
            .map(|i| (i, members.set(i, false)))
            .collect();
        let noted: Pending<T> = pending
            .into_iter()
            .map(|answer| {
                let (members, left) = (members.clone(), left.clone());
                Box::pin(async move {
                    let (i, result) = answer.await;
                    if let Some(&(_, recorded)) = left.iter().find(|(m, _)| *m == i) {
                        members.set_if(i, holds(&result), recorded);
                    }
                    (i, result)
                }) as BoxFuture<'static, Answer<T>>
            })
            .collect();
        self.detach(key, what, answered, noted).await;
    }

    /// Forgets what the members said: the holder let go (or is taking its lock back).
    pub(super) fn forget(&self, key: &Key) {
        key.take_handle::<Members>(self.owner);
    }

    /// How long members enough to meet the strategy certainly hold `key`'s lock (see
    /// [`Store::lease_remaining`] on [`CombinedStore`]).
    pub(super) fn quorum_lease(&self, key: &Key) -> Option<Duration> {
        if !self.stores.iter().any(|s| s.capabilities().leased) {
            return None;
        }
        let members = key.existing_handle::<Members>(self.owner)?;
        let spans: Vec<Duration> = self
            .stores
            .iter()
            .enumerate()
            .map(|(i, s)| member_span(s.as_ref(), key, members.holds(i)))
            .collect();
        quorum_span(self.strategy.as_ref(), spans)
    }
}

/// How long one member certainly holds: a member on a lease for what its server confirmed
/// (its own record of what it holds); any other, where its last answer said it holds, for as
/// long as the lock lasts anyway, else not at all.
fn member_span(store: &dyn Store, key: &Key, holds: bool) -> Duration {
    match (store.capabilities().leased, holds) {
        (true, _) => store.lease_remaining(key).unwrap_or(Duration::ZERO),
        (false, true) => Duration::MAX,
        (false, false) => Duration::ZERO,
    }
}

/// The longest span that members enough to meet `strategy` all reach, given each member's.
pub(super) fn quorum_span(strategy: &dyn Strategy, mut spans: Vec<Duration>) -> Option<Duration> {
    let total = spans.len();
    let needed = (1..=total).find(|&k| strategy.is_met(k, total))?;
    spans.sort_unstable_by(|a, b| b.cmp(a));
    Some(spans[needed - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ConsensusStrategy, UnanimousStrategy};

    #[test]
    fn a_quorum_lasts_as_long_as_its_kth_longest_member() {
        let s = |ms: &[u64]| ms.iter().map(|&m| Duration::from_millis(m)).collect();
        let ms = Duration::from_millis;
        assert_eq!(
            quorum_span(&ConsensusStrategy, s(&[300, 0, 900])),
            Some(ms(300))
        );
        assert_eq!(
            quorum_span(&ConsensusStrategy, s(&[0, 0, 900])),
            Some(ms(0))
        );
        assert_eq!(
            quorum_span(&UnanimousStrategy, s(&[300, 200, 900])),
            Some(ms(200))
        );
        assert_eq!(quorum_span(&ConsensusStrategy, Vec::new()), None);
    }

    #[test]
    fn the_record_counts_only_members_that_said_they_hold() {
        let members = Members::default();
        assert!(!members.holds(0));
        members.set(0, true);
        members.set(1, false);
        assert!(members.holds(0));
        assert!(!members.holds(1));
        assert!(!members.holds(5));
    }

    #[test]
    fn an_answer_left_to_the_background_never_overwrites_a_newer_one() {
        let members = Members::default();
        // Left unanswered by one request (counted out), then by a later one.
        let first = members.set(2, false);
        let second = members.set(2, false);
        // The first request's answer comes last: it is stale.
        members.set_if(2, true, first);
        assert!(!members.holds(2));
        // The later request's own answer counts.
        members.set_if(2, true, second);
        assert!(members.holds(2));
    }
}
