//! One tally for every quorum operation: member answers come in as votes, and the strategy says
//! when the outcome is decided.

use futures_util::StreamExt as _;

use super::inflight::Pending;
use super::strategy::Strategy;
use crate::error::{LostReason, Result};

/// A member's answer, as far as the quorum is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Vote {
    /// The member did what was asked (stored, extended, removed, holds).
    Yes,
    /// The member answered, and not as asked (someone else holds, nothing there).
    No,
    /// The member failed (unreachable, timed out, refused): a vote against.
    Failed,
}

/// Where the count stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Members enough voted yes.
    Met,
    /// Members enough voted against that it can no longer be met.
    Missed,
    /// Not decided yet.
    Open,
}

/// The votes of one operation over `total` members.
#[derive(Debug)]
pub(super) struct Tally<'s> {
    strategy: &'s dyn Strategy,
    total: usize,
    pub(super) yes: usize,
    pub(super) no: usize,
    pub(super) failed: usize,
    /// Which members have answered.
    pub(super) answered: Vec<bool>,
}

impl<'s> Tally<'s> {
    pub(super) fn new(strategy: &'s dyn Strategy, total: usize) -> Self {
        Tally {
            strategy,
            total,
            yes: 0,
            no: 0,
            failed: 0,
            answered: vec![false; total],
        }
    }

    /// Counts member `i`'s vote.
    pub(super) fn add(&mut self, i: usize, vote: Vote) -> Verdict {
        self.answered[i] = true;
        match vote {
            Vote::Yes => self.yes += 1,
            Vote::No => self.no += 1,
            Vote::Failed => self.failed += 1,
        }
        self.verdict()
    }

    pub(super) fn verdict(&self) -> Verdict {
        if self.strategy.is_met(self.yes, self.total) {
            Verdict::Met
        } else if !self.strategy.can_be_met(self.no + self.failed, self.total) {
            Verdict::Missed
        } else {
            Verdict::Open
        }
    }

    /// Takes answers from `pending`, judged by `judge`, until the outcome is decided (or every
    /// member answered).
    pub(super) async fn count<T>(
        &mut self,
        pending: &mut Pending<T>,
        mut judge: impl FnMut(usize, Result<T>) -> Vote,
    ) -> Verdict {
        while let Some((i, answer)) = pending.next().await {
            let vote = judge(i, answer);
            if self.add(i, vote) != Verdict::Open {
                break;
            }
        }
        self.verdict()
    }
}

/// The reason that says most about a lost lock, of those members gave: someone else holding it
/// beats an expiry, which beats a removal.
pub(super) fn most_telling(reasons: &[LostReason]) -> Option<LostReason> {
    let rank = |r: &LostReason| match r {
        LostReason::TakenOver => 0,
        LostReason::Replaced => 1,
        LostReason::Expired => 2,
        LostReason::Disconnected => 3,
        LostReason::Removed => 4,
        _ => 5,
    };
    reasons.iter().copied().min_by_key(rank)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ConsensusStrategy, UnanimousStrategy};

    #[test]
    fn consensus_decides_at_the_majority_either_way() {
        let mut t = Tally::new(&ConsensusStrategy, 3);
        assert_eq!(t.add(0, Vote::Yes), Verdict::Open);
        assert_eq!(t.add(2, Vote::Yes), Verdict::Met);
        let mut t = Tally::new(&ConsensusStrategy, 3);
        assert_eq!(t.add(0, Vote::No), Verdict::Open);
        assert_eq!(t.add(1, Vote::Failed), Verdict::Missed);
        assert_eq!(t.answered, vec![true, true, false]);
    }

    #[test]
    fn unanimous_is_missed_at_the_first_vote_against() {
        let mut t = Tally::new(&UnanimousStrategy, 3);
        assert_eq!(t.add(0, Vote::Yes), Verdict::Open);
        assert_eq!(t.add(1, Vote::Failed), Verdict::Missed);
    }

    #[test]
    fn the_most_telling_reason_wins() {
        use LostReason::*;
        assert_eq!(most_telling(&[Removed, Expired]), Some(Expired));
        assert_eq!(
            most_telling(&[Removed, TakenOver, Expired]),
            Some(TakenOver)
        );
        assert_eq!(most_telling(&[]), None);
    }
}
