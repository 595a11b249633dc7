//! Scenarios for leader election: one leader at a time, terms that grow, observers that see
//! every change, loss reported, campaigns that can be dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::{Harness, Outcome, require};
use crate::election::{Election, Leader};
use crate::lock::lockable::Release;

/// Lets a candidate reach its wait: a real-time pause, never a correctness condition.
const SETTLE: Duration = Duration::from_millis(100);

fn election(h: &Harness, name: &str) -> Election {
    h.factory().create_election(name)
}

fn can_elect(h: &Harness) -> bool {
    h.caps().excludes && h.caps().introspection
}

/// The leader's value, where the store keeps values.
fn value_of(h: &Harness, leader: &Leader) -> Option<Vec<u8>> {
    if h.caps().metadata {
        assert!(
            leader.value.is_some(),
            "a leader without its value: {leader:?}"
        );
    }
    leader.value.clone()
}

/// One candidate leads; another waits until it resigns, then leads with a larger term; both
/// and an outsider see who leads.
pub async fn election_one_leader_at_a_time(h: Harness) -> Outcome {
    require!(can_elect(&h), "the store cannot exclude or tell who holds");
    let name = h.resource("election");
    let (a, b) = (election(&h, &name), election(&h, &name));
    assert!(a.leader().await.unwrap().is_none(), "nobody leads yet");
    let first = a.campaign("a").await.unwrap();
    assert!(*a.is_leader().borrow());
    let leader = b.leader().await.unwrap().expect("a leads");
    if let Some(v) = value_of(&h, &leader) {
        assert_eq!(v, b"a");
    }
    if h.caps().fencing {
        assert!(first.term().is_some());
        assert_eq!(leader.term, first.term(), "{leader:?}");
    }
    let waiting = tokio::time::timeout(SETTLE * 3, b.campaign("b")).await;
    assert!(waiting.is_err(), "b must not lead while a leads");
    assert!(!*b.is_leader().borrow());

    let b2 = b.clone();
    let standby = tokio::spawn(async move { b2.campaign("b").await });
    tokio::time::sleep(SETTLE).await;
    assert_eq!(a.resign().await.unwrap(), Release::Released);
    assert!(!*a.is_leader().borrow());
    let second = h
        .within("b leads after a resigned", standby)
        .await
        .unwrap()
        .unwrap();
    assert!(*b.is_leader().borrow());
    let leader = a.leader().await.unwrap().expect("b leads");
    if let Some(v) = value_of(&h, &leader) {
        assert_eq!(v, b"b");
    }
    if h.caps().fencing {
        assert!(second.term() > first.term(), "{second:?} after {first:?}");
    }
    assert_eq!(
        a.resign().await.unwrap(),
        Release::NotHeld,
        "a leads no more"
    );
    assert_eq!(b.resign().await.unwrap(), Release::Released);
    assert!(a.leader().await.unwrap().is_none());
    Outcome::Ran
}

/// An observer answers the current leader, then every change in order, and `None` while
/// nobody leads.
pub async fn election_observers_see_every_change_in_order(h: Harness) -> Outcome {
    require!(can_elect(&h), "the store cannot exclude or tell who holds");
    let name = h.resource("observe");
    let mut observer = election(&h, &name)
        .observe()
        .with_poll(Duration::from_millis(50));
    assert_eq!(observer.next().await.unwrap(), None, "nobody leads yet");
    let mut last_term = None;
    for round in 0..3u8 {
        let candidate = election(&h, &name);
        let value = format!("candidate {round}");
        let leadership = candidate.campaign(value.clone()).await.unwrap();
        let seen = h
            .within("the observer sees the new leader", async {
                loop {
                    if let Some(l) = observer.next().await.unwrap() {
                        return l;
                    }
                }
            })
            .await;
        if let Some(v) = value_of(&h, &seen) {
            assert_eq!(v, value.as_bytes(), "{seen:?}");
        }
        assert_eq!(seen.term, leadership.term());
        if h.caps().fencing {
            assert!(
                seen.term > last_term,
                "terms grow: {seen:?} after {last_term:?}"
            );
        }
        last_term = seen.term;
        assert_eq!(candidate.resign().await.unwrap(), Release::Released);
        let gone = h
            .within("the observer sees no leader", observer.next())
            .await;
        assert_eq!(gone.unwrap(), None, "after a resignation, nobody leads");
    }
    Outcome::Ran
}

/// A leader whose lock is taken away is told, with why, and stops leading; with re-campaign it
/// leads again, with a larger term.
pub async fn election_loss_is_reported_and_recampaign_leads_again(h: Harness) -> Outcome {
    require!(can_elect(&h), "the store cannot exclude or tell who holds");
    let Some(sabotage) = h.sabotage() else {
        return Outcome::NotApplicable("no way to take a lock away behind its holder's back");
    };
    let name = h.resource("election-loss");
    let once = election(&h, &name);
    let leadership = once.campaign("once").await.unwrap();
    sabotage(once.leading_key().expect("it leads")).await;
    let lost = h.within("the loss is reported", leadership.lost()).await;
    assert!(!lost.reason.to_string().is_empty());
    let mut leading = once.is_leader();
    h.within("is_leader turns false", leading.wait_for(|l| !*l))
        .await
        .unwrap();
    assert!(once.leadership().is_none());

    let again = election(&h, &name).with_recampaign(true);
    let first = again.campaign("again").await.unwrap();
    sabotage(again.leading_key().expect("it leads")).await;
    let _ = h.within("the loss is reported", first.lost()).await;
    let mut leading = again.is_leader();
    h.within("it leads again", leading.wait_for(|l| *l))
        .await
        .unwrap();
    let second = again.leadership().expect("leading again");
    if h.caps().fencing {
        assert!(second.term() > first.term(), "{second:?} after {first:?}");
    }
    assert_eq!(again.resign().await.unwrap(), Release::Released);
    Outcome::Ran
}

/// A campaign dropped while it waits holds nothing and takes no place: once the leader
/// resigns, nobody leads, and a new candidate leads at once.
pub async fn dropped_campaign_holds_nothing(h: Harness) -> Outcome {
    require!(can_elect(&h), "the store cannot exclude or tell who holds");
    let name = h.resource("election-drop");
    let (a, b, c) = (
        election(&h, &name),
        election(&h, &name),
        election(&h, &name),
    );
    let _ = a.campaign("a").await.unwrap();
    assert!(
        tokio::time::timeout(SETTLE, b.campaign("b")).await.is_err(),
        "b waits"
    );
    assert_eq!(a.resign().await.unwrap(), Release::Released);
    crate::settle(h.patience).await;
    let leader = a.leader().await.unwrap();
    assert!(leader.is_none(), "the dropped campaign leads: {leader:?}");
    let _ = h.within("c leads at once", c.campaign("c")).await.unwrap();
    assert!(!*b.is_leader().borrow());
    assert_eq!(c.resign().await.unwrap(), Release::Released);
    Outcome::Ran
}

/// Three candidates take 30 turns: never two leaders' work at once (a marker no two may
/// set), terms strictly increasing across every change.
pub async fn election_never_has_two_leaders(h: Harness) -> Outcome {
    require!(can_elect(&h), "the store cannot exclude or tell who holds");
    let name = h.resource("election-many");
    let inside = Arc::new(AtomicBool::new(false));
    let last_term = Arc::new(AtomicU64::new(0));
    let fencing = h.caps().fencing;
    let mut tasks = Vec::new();
    for c in 0..3 {
        let (e, inside, last_term) = (election(&h, &name), inside.clone(), last_term.clone());
        tasks.push(tokio::spawn(async move {
            for turn in 0..10 {
                let leadership = e.campaign(format!("{c}/{turn}")).await.unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two leaders at once");
                if fencing {
                    let term = leadership.term().expect("a fenced term");
                    let before = last_term.swap(term, Ordering::SeqCst);
                    assert!(term > before, "term {term} after {before}");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.store(false, Ordering::SeqCst);
                assert_eq!(e.resign().await.unwrap(), Release::Released);
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(h.patience * 6, t)
            .await
            .expect("30 leaderships within six times the patience")
            .unwrap();
    }
    Outcome::Ran
}
