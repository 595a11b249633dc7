//! The election front end beyond the conformance scenarios: one candidate's own rules, drop,
//! re-campaign switched on later, observers as streams, metadata on keys.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use xtr_lock::{ErrorKind, InMemoryStore, Key, LockFactory, Release, Store as _};

fn factory() -> LockFactory {
    LockFactory::new(InMemoryStore::new())
}

#[tokio::test]
async fn a_leader_campaigning_again_gets_its_leadership_or_is_told_to_resign() {
    let f = factory();
    let e = f.create_election("e1");
    let first = e.campaign("a").await.unwrap();
    let again = e.campaign("a").await.unwrap();
    assert_eq!(again.term(), first.term(), "the same leadership");
    let err = e.campaign("b").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("resign first"), "{err}");
    let err = e
        .campaign(vec![0u8; xtr_lock::MAX_META + 1])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert_eq!(e.resign().await.unwrap(), Release::Released);
    assert_eq!(e.resign().await.unwrap(), Release::NotHeld);
}

#[tokio::test]
async fn dropping_the_last_clone_of_a_leader_lets_another_lead() {
    let f = factory();
    let (a, b) = (f.create_election("e2"), f.create_election("e2"));
    let _ = a.campaign("a").await.unwrap();
    let clone = a.clone();
    drop(a);
    assert!(*clone.is_leader().borrow(), "a clone keeps the candidate");
    drop(clone);
    let led = tokio::time::timeout(Duration::from_secs(10), b.campaign("b")).await;
    assert!(led.expect("b leads once a is gone").is_ok());
}

#[tokio::test]
async fn recampaign_switched_on_after_the_campaign_applies_to_the_next_loss() {
    let store = Arc::new(InMemoryStore::new());
    let f = LockFactory::from_arc(store.clone());
    let e = f.create_election("e3");
    let first = e.campaign("a").await.unwrap();
    e.set_recampaign(true);
    let copy = Key::from_json(&e.leading_key().unwrap().to_json().unwrap()).unwrap();
    assert!(
        store.delete(&copy).await.unwrap(),
        "taken away behind its back"
    );
    let _ = tokio::time::timeout(Duration::from_secs(10), first.lost())
        .await
        .expect("the loss is reported");
    let mut leading = e.is_leader();
    tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| *l))
        .await
        .expect("it leads again")
        .unwrap();
    let second = e.leadership().unwrap();
    assert!(second.term() > first.term());
    assert!(first.lost_now().is_some() && second.lost_now().is_none());
}

#[tokio::test]
async fn an_observer_is_a_stream_of_changes() {
    let f = factory();
    let e = f.create_election("e4");
    let mut changes = Box::pin(e.observe().into_stream());
    assert_eq!(changes.next().await.unwrap().unwrap(), None);
    let _ = e.campaign("host-a").await.unwrap();
    let leader = changes.next().await.unwrap().unwrap().unwrap();
    assert_eq!(leader.value_lossy(), "host-a");
    assert_eq!(leader.pid, Some(std::process::id()));
    assert!(leader.since.is_some());
    let _ = e.resign().await.unwrap();
    assert_eq!(changes.next().await.unwrap().unwrap(), None);
}

#[tokio::test]
async fn metadata_travels_with_the_key_and_is_checked_on_the_way_in() {
    let key = Key::new("r").with_meta(b"job=7\0".to_vec()).unwrap();
    let copy = Key::from_json(&key.to_json().unwrap()).unwrap();
    assert_eq!(copy.meta().as_deref(), Some(&b"job=7\0"[..]));
    assert!(
        Key::from_json(&Key::new("r").to_json().unwrap())
            .unwrap()
            .meta()
            .is_none()
    );
    let big = format!(
        r#"{{"v":1,"resource":"r","meta":"{}"}}"#,
        "QUFB".repeat(400) // 1200 bytes
    );
    let err = Key::from_json(&big).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = Key::from_json(r#"{"v":1,"resource":"r","meta":"!"}"#).unwrap_err();
    assert!(err.to_string().contains("meta"), "{err}");
}

#[test]
fn the_blocking_election_waits_for_changes_and_lets_go_when_dropped() {
    let f = xtr_lock::blocking::LockFactory::from_dsn("in-memory").unwrap();
    let (a, b) = (f.create_election("e5"), f.create_election("e5"));
    assert_eq!(
        b.wait_change(None, Duration::from_millis(20)).unwrap(),
        None,
        "nobody leads, and nothing changed"
    );
    let leading = a.campaign("a").unwrap();
    assert!(a.is_leader() && a.leadership().is_some());
    let now = b.wait_change(None, Duration::from_secs(10)).unwrap();
    let leader = now.expect("a change").expect("a leader");
    assert_eq!(
        (leader.value_lossy(), leader.term),
        ("a".to_owned(), leading.term())
    );
    drop(a);
    let gone = b
        .wait_change(Some(&leader), Duration::from_secs(10))
        .unwrap();
    assert_eq!(gone, Some(None), "the dropped leader let go");
    assert!(
        b.campaign_timeout("b", Duration::from_secs(10))
            .unwrap()
            .is_some()
    );
    let _ = b.resign().unwrap();
}

#[tokio::test]
async fn a_resignation_ends_a_waiting_campaign_of_the_same_candidate() {
    let f = factory();
    let (leader, standby) = (f.create_election("e6"), f.create_election("e6"));
    let _ = leader.campaign("leader").await.unwrap();
    let waiting = standby.clone();
    let campaign = tokio::spawn(async move { waiting.campaign("standby").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(standby.resign().await.unwrap(), Release::NotHeld);
    let err = tokio::time::timeout(Duration::from_secs(10), campaign)
        .await
        .expect("the waiting campaign gives up")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert!(err.to_string().contains("resigned"), "{err}");
    let _ = leader.resign().await.unwrap();
    xtr_lock::settle(Duration::from_secs(5)).await;
    assert!(
        standby.leader().await.unwrap().is_none(),
        "the given-up campaign holds nothing"
    );
}
