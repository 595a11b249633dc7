//! When a quorum is met.

use std::fmt;

/// Decides whether enough members agreed (`is_met`) and whether they still can (`can_be_met`).
pub trait Strategy: Send + Sync + fmt::Debug + fmt::Display + 'static {
    /// Whether `successes` out of `total` members are enough.
    fn is_met(&self, successes: usize, total: usize) -> bool;
    /// Whether the strategy can still be met with `failures` out of `total` already against.
    fn can_be_met(&self, failures: usize, total: usize) -> bool;
}

/// A strict majority (Redlock): met iff successes > total / 2.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConsensusStrategy;

impl Strategy for ConsensusStrategy {
    fn is_met(&self, successes: usize, total: usize) -> bool {
        successes * 2 > total
    }
    fn can_be_met(&self, failures: usize, total: usize) -> bool {
        failures * 2 < total
    }
}

impl fmt::Display for ConsensusStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("consensus")
    }
}

/// Every member: met iff successes == total.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnanimousStrategy;

impl Strategy for UnanimousStrategy {
    fn is_met(&self, successes: usize, total: usize) -> bool {
        successes == total
    }
    fn can_be_met(&self, failures: usize, _total: usize) -> bool {
        failures == 0
    }
}

impl fmt::Display for UnanimousStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unanimous")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consensus_truth_table() {
        let s = ConsensusStrategy;
        for (succ, n, want) in [
            (2, 3, true),
            (1, 2, false),
            (1, 1, true),
            (3, 4, true),
            (2, 4, false),
        ] {
            assert_eq!(s.is_met(succ, n), want, "is_met({succ}, {n})");
        }
        for (fail, n, want) in [(1, 3, true), (1, 2, false), (0, 2, true), (2, 4, false)] {
            assert_eq!(s.can_be_met(fail, n), want, "can_be_met({fail}, {n})");
        }
    }

    #[test]
    fn unanimous_truth_table() {
        let s = UnanimousStrategy;
        assert!(s.is_met(3, 3) && !s.is_met(2, 3));
        assert!(s.can_be_met(0, 3) && !s.can_be_met(1, 3));
    }
}
