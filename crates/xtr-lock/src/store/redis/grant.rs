//! Direct hand-off: a release that grants the lock to the writer at the head of the queue, and
//! how that writer's store takes the grant in without a round trip of its own (see
//! `docs/waking.md`, "A grant in the release").
//!
//! The release writes the waiter's token as the lock's writer for the waiter's ttl, dated on the
//! server's clock at `S`, and publishes `S` and the fencing token with the wake. The waiter
//! cannot read the server's clock, so it dates its lease from something it knows to precede the
//! grant: its last refused save, sent at `sent` on its own clock and run at `Q` on the server's
//! (the refusal's answer says `Q`). Since `sent` ≤ `Q` and `S − Q` is measured on one clock, the
//! lease it believes in, `sent + (S − Q) + ttl`, never ends after the server's, even if it was
//! paused between the grant and the wake's arrival.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::lock;

/// A grant a release sent a waiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Grant {
    /// The fencing token the release advanced the counter to.
    pub(super) fence: u64,
    /// The server's clock when the release ran (µs since the Unix epoch).
    pub(super) at_us: u64,
    /// The lease the grant wrote (the waiter's ttl, from its ticket), in ms.
    pub(super) ttl_ms: u64,
    /// The waiter's token.
    pub(super) token: String,
}

impl Grant {
    /// The grant's entry's score on the server: its lease's end, in ms.
    pub(super) fn score(&self) -> u64 {
        (self.at_us / 1000).saturating_add(self.ttl_ms)
    }
}

/// A wake's head, as the release published it: `<store id><number>`, then `:<ttl ms>` for a
/// ticket that accepts grants or `.<permits>` for a semaphore waiter's, then, for a grant,
/// `;<fence>;<server clock µs>;<token>`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Who<'a> {
    /// The waiter's number in its store (`None`: not a number).
    pub(super) number: Option<u64>,
    pub(super) semaphore: bool,
    /// The ticket's tail (from the store id on): what the `WAKE` script looks the ticket up by.
    pub(super) tail: &'a str,
    pub(super) grant: Option<Grant>,
}

/// Reads a wake's head (see [`Who`]).
pub(super) fn parse_who(who: &str) -> Who<'_> {
    let (tail, granted) = who.split_once(';').unwrap_or((who, ""));
    let rest = tail.get(22..).unwrap_or("");
    let semaphore = rest.contains('.');
    let digits = rest.split([':', '.']).next().unwrap_or("");
    let ttl_ms = rest.split_once(':').and_then(|(_, t)| t.parse().ok());
    let grant = (!granted.is_empty())
        .then(|| {
            let mut parts = granted.splitn(3, ';');
            let fence = parts.next()?.parse().ok()?;
            let at_us = parts.next()?.parse().ok()?;
            let token = parts.next().filter(|t| t.len() == 44)?;
            Some(Grant {
                fence,
                at_us,
                ttl_ms: ttl_ms?,
                token: token.to_owned(),
            })
        })
        .flatten();
    Who {
        number: digits.parse().ok(),
        semaphore,
        tail,
        grant,
    }
}

/// One waiter's side of direct hand-off.
#[derive(Default)]
pub(super) struct Grants {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The waiter's last refused save: when it was sent (its key's clock) and the server's
    /// clock when it ran (µs).
    anchor: Option<(Instant, u64)>,
    /// A grant that arrived and was not taken in yet.
    offered: Option<Grant>,
    /// Whether the offered grant may be taken in without asking the server: not after the wake
    /// channel dropped (a save may have re-saved it meanwhile without telling this waiter).
    trusted: bool,
    /// The fencing token of the waiter's last admitted save: a grant at or below it was taken
    /// in by a save that crossed its wake (the save found the grant and re-saved it).
    admitted: u64,
}

impl Grants {
    /// A save of the waiter sent at `sent` was refused by a script that ran at `server_us` (0:
    /// on the client's clock, which grants never use).
    pub(super) fn refused(&self, sent: Instant, server_us: u64) {
        if server_us > 0 {
            lock(&self.state).anchor = Some((sent, server_us));
        }
    }

    /// A save of the waiter was admitted with `fence`: a grant up to it is spent.
    pub(super) fn admitted(&self, fence: u64) {
        let mut st = lock(&self.state);
        st.admitted = st.admitted.max(fence);
        if st.offered.as_ref().is_some_and(|g| g.fence <= fence) {
            st.offered = None;
        }
    }

    /// A release granted the waiter the lock; `false` if a save of the waiter already took the
    /// grant in.
    pub(super) fn offer(&self, grant: Grant) -> bool {
        let mut st = lock(&self.state);
        if grant.fence <= st.admitted {
            return false;
        }
        st.offered = Some(grant);
        st.trusted = true;
        true
    }

    /// The wake channel dropped: an offered grant is only taken back, never taken in (saves
    /// made meanwhile went without a ticket, and may have re-saved and released it).
    pub(super) fn distrust(&self) {
        lock(&self.state).trusted = false;
    }

    /// The highest token the waiter took in or was admitted with.
    pub(super) fn last_admitted(&self) -> u64 {
        lock(&self.state).admitted
    }

    /// The grant nobody took in, if any (the waiter is gone: the store takes it back).
    pub(super) fn take(&self) -> Option<Grant> {
        lock(&self.state).offered.take()
    }

    /// Takes the grant in for a save made at `now` for `ttl_ms`: the grant and when the lease it
    /// gives ends on the waiter's clock. `None` (the grant stays, for the save to re-save it on
    /// the server) without a trusted grant for that ttl, without a refusal known to precede it,
    /// when the refusal came more than a ttl before the grant (the two server times would
    /// measure a long wait, with whatever drift it had), or when less than half the ttl would be
    /// left.
    pub(super) fn take_in(&self, now: Instant, ttl_ms: u64) -> Option<(Grant, Instant)> {
        let mut st = lock(&self.state);
        let grant = st.offered.as_ref().filter(|g| g.ttl_ms == ttl_ms)?;
        let (sent, at_us) = st.anchor.filter(|_| st.trusted)?;
        let since_refusal = grant.at_us.checked_sub(at_us)?;
        if since_refusal / 1000 > grant.ttl_ms {
            return None;
        }
        // The score is the grant's ms, rounded down, plus the ttl: up to 1 ms earlier.
        let lease = Duration::from_millis(grant.ttl_ms).checked_sub(Duration::from_millis(1))?;
        let ends = sent
            .checked_add(Duration::from_micros(since_refusal))?
            .checked_add(lease)?;
        if ends.saturating_duration_since(now) < lease / 2 {
            return None;
        }
        let grant = st.offered.take()?;
        st.admitted = st.admitted.max(grant.fence);
        Some((grant, ends))
    }
}

/// The suffix of a write ticket that accepts a grant for `ttl`.
pub(super) fn ticket_suffix(ttl: Duration) -> String {
    format!(":{}", ttl_ms(ttl))
}

/// `ttl` in whole ms, as a ticket says it (at least 1).
pub(super) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "abcdefghijklmnopqrstuv";
    const TOKEN: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAeHRyLXdha2U=";

    #[test]
    fn wakes_are_read_whatever_their_ticket() {
        let (plain, sem, asks) = (format!("{ID}17"), format!("{ID}3.2"), format!("{ID}5:2000"));
        let plain = parse_who(&plain);
        assert_eq!(
            (plain.number, plain.semaphore, plain.grant),
            (Some(17), false, None)
        );
        let sem = parse_who(&sem);
        assert_eq!((sem.number, sem.semaphore), (Some(3), true));
        let tail = asks.clone();
        let asks = parse_who(&asks);
        assert_eq!(
            (asks.number, asks.grant, asks.tail),
            (Some(5), None, tail.as_str())
        );
        let head = format!("{ID}5:2000;42;1700000000123456;{TOKEN}");
        let granted = parse_who(&head);
        assert_eq!(granted.number, Some(5));
        assert_eq!(granted.tail, format!("{ID}5:2000"));
        let grant = granted.grant.unwrap();
        assert_eq!(
            (grant.fence, grant.at_us, grant.ttl_ms),
            (42, 1_700_000_000_123_456, 2000)
        );
        assert_eq!(grant.score(), 1_700_000_000_123 + 2000);
        // Malformed grants are wakes without one; nothing panics.
        for bad in [
            format!("{ID}5;42;1;{TOKEN}"),
            format!("{ID}5:2000;x;1;{TOKEN}"),
            format!("{ID}5:2000;1;1;short"),
            "".to_owned(),
            "é".to_owned(),
        ] {
            assert_eq!(parse_who(&bad).grant, None, "{bad}");
        }
    }

    fn grant(fence: u64, at_us: u64) -> Grant {
        Grant {
            fence,
            at_us,
            ttl_ms: 10_000,
            token: TOKEN.to_owned(),
        }
    }

    #[test]
    fn a_grant_is_dated_from_the_refusal_before_it() {
        let g = Grants::default();
        let sent = Instant::now();
        // No refusal known: the save goes to the server.
        g.offer(grant(7, 5_000_000));
        assert_eq!(g.take_in(sent, 10_000), None);
        // Refused at 4 s on the server's clock, granted at 5 s: the lease ends 1 s + ttl after
        // the refused save was sent, less the rounding's ms.
        g.refused(sent, 4_000_000);
        let (taken, ends) = g.take_in(sent, 10_000).unwrap();
        assert_eq!(taken.fence, 7);
        assert_eq!(ends, sent + Duration::from_millis(1_000 + 10_000 - 1));
        // Spent: neither taken in again nor taken back.
        assert_eq!(g.take_in(sent, 10_000), None);
        assert_eq!(g.take(), None);
        assert!(!g.offer(grant(7, 5_000_000)), "a spent grant came again");
    }

    #[test]
    fn a_grant_is_not_believed_when_little_of_it_is_left_or_it_precedes_the_refusal() {
        let g = Grants::default();
        let sent = Instant::now();
        g.refused(sent, 4_000_000);
        g.offer(grant(9, 5_000_000));
        // 6 s after the refused save was sent: 5 s of the 11 s are left, under half the ttl.
        assert_eq!(g.take_in(sent + Duration::from_secs(6), 10_000), None);
        // A refusal after the grant (another clock after a fail-over): not comparable.
        g.refused(sent, 6_000_000);
        assert_eq!(g.take_in(sent, 10_000), None);
        // The grant stays for the store to take back if the waiter goes.
        assert_eq!(g.take().map(|g| g.fence), Some(9));
    }

    #[test]
    fn a_grant_is_taken_in_only_for_its_ttl_while_trusted_and_soon_after_the_refusal() {
        let g = Grants::default();
        let sent = Instant::now();
        g.refused(sent, 4_000_000);
        g.offer(grant(9, 5_000_000));
        assert_eq!(g.take_in(sent, 2_000), None, "asked for another ttl");
        g.distrust();
        assert_eq!(
            g.take_in(sent, 10_000),
            None,
            "the wake channel dropped since"
        );
        assert_eq!(g.take().map(|g| g.fence), Some(9), "it is still given back");
        // A refusal more than a ttl before the grant: the server's clock measured a long wait.
        g.refused(sent, 4_000_000);
        g.offer(grant(10, 4_000_000 + 10_001_000));
        assert_eq!(g.take_in(sent, 10_000), None);
        // A huge ttl in a forged wake neither overflows nor panics.
        let mut odd = grant(11, u64::MAX);
        odd.ttl_ms = u64::MAX;
        assert_eq!(odd.score(), u64::MAX);
        g.offer(odd);
        assert_eq!(g.take_in(sent, 10_000), None, "not the ttl asked for");
        let _ = g.take_in(sent, u64::MAX);
    }

    #[test]
    fn a_save_that_crossed_the_grant_spends_it() {
        let g = Grants::default();
        g.refused(Instant::now(), 4_000_000);
        g.offer(grant(9, 5_000_000));
        g.admitted(9);
        assert_eq!(
            g.take(),
            None,
            "a grant the save re-saved would be taken back"
        );
        // The wake arriving after the save's answer is stale.
        assert!(!g.offer(grant(9, 5_000_000)));
        assert!(g.offer(grant(10, 6_000_000)));
    }
}
