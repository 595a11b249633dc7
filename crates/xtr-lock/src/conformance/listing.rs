//! Scenarios for holder metadata, listing and change notifications to observers.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::{Harness, Outcome, require};
use crate::error::ErrorKind;
use crate::key::Mode;
use crate::lock::lockable::Lockable as _;
use crate::meta::MAX_META;
use crate::store::{HolderInfo, Listing};

/// How far a store's acquisition time may be from this machine's clock around the save (a
/// server on the same machine; seconds-precision stores round).
const CLOCK_SLACK: Duration = Duration::from_secs(3);

fn near(at: Option<SystemTime>, before: SystemTime, after: SystemTime) -> bool {
    at.is_some_and(|at| at + CLOCK_SLACK >= before && at <= after + CLOCK_SLACK)
}

/// The live holders (waiters aside).
fn holding(holders: &[HolderInfo]) -> Vec<&HolderInfo> {
    holders.iter().filter(|h| !h.waiting).collect()
}

/// A holder's metadata and acquisition time are stored beside its lock and shown by
/// `holders`, for writers, readers and a semaphore's permits; binary values come back as
/// they went in.
pub async fn holders_carry_metadata(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().metadata, "the store keeps no holder metadata");
    let r = h.resource("meta");
    let before = SystemTime::now();
    let meta = b"host=a pid=1\0\xff".to_vec();
    let lock = h.lock(&r, h.ttl).with_meta(meta.clone()).unwrap();
    assert!(lock.try_acquire().await.unwrap());
    let after = SystemTime::now();
    let holders = h.store.holders(&r).await.unwrap();
    let live = holding(&holders);
    assert_eq!(live.len(), 1, "{holders:?}");
    assert_eq!(live[0].meta.as_deref(), Some(&meta[..]), "{holders:?}");
    assert!(near(live[0].acquired_at, before, after), "{holders:?}");
    if h.caps().fencing {
        assert_eq!(live[0].fencing_token, lock.fencing_token(), "{holders:?}");
    }
    // A re-save replaces the metadata and keeps the acquisition time; a renewal keeps both.
    let first_at = live[0].acquired_at;
    lock.key().set_meta(Some(b"host=b".to_vec())).unwrap();
    assert!(h.store.save(lock.key(), h.ttl).await.unwrap().is_acquired());
    if let Some(ttl) = h.ttl {
        lock.refresh(Some(ttl)).await.unwrap();
    }
    let holders = h.store.holders(&r).await.unwrap();
    let live = holding(&holders);
    assert_eq!(live[0].meta.as_deref(), Some(&b"host=b"[..]), "{holders:?}");
    assert_eq!(live[0].acquired_at, first_at, "{holders:?}");
    assert!(lock.release().await.unwrap().was_held());
    assert!(holding(&h.store.holders(&r).await.unwrap()).is_empty());
    // The record went with the lock: the next holder carries none.
    let bare = h.lock(&r, h.ttl);
    assert!(bare.try_acquire().await.unwrap());
    let holders = h.store.holders(&r).await.unwrap();
    assert_eq!(holding(&holders)[0].meta, None, "{holders:?}");
    let _ = bare.release().await.unwrap();

    if h.caps().shared {
        let (a, b) = (h.lock(&r, h.ttl), h.lock(&r, h.ttl));
        a.key().set_meta(Some(b"reader a".to_vec())).unwrap();
        assert!(a.try_acquire_read().await.unwrap());
        assert!(b.try_acquire_read().await.unwrap());
        let holders = h.store.holders(&r).await.unwrap();
        let metas: Vec<_> = holding(&holders).iter().map(|h| h.meta.clone()).collect();
        assert!(metas.contains(&Some(b"reader a".to_vec())), "{holders:?}");
        assert!(
            metas.contains(&None),
            "a holder without metadata: {holders:?}"
        );
        for l in [a, b] {
            let _ = l.release().await.unwrap();
        }
    }
    if h.caps().counting {
        let s = h.factory().create_semaphore(&r, 2).unwrap();
        s.key().set_meta(Some(b"permit".to_vec())).unwrap();
        assert!(s.try_acquire().await.unwrap());
        let usage = s.usage().await.unwrap();
        assert_eq!(usage.holders.len(), 1, "{usage:?}");
        assert_eq!(usage.holders[0].meta.as_deref(), Some(&b"permit"[..]));
        assert!(usage.holders[0].acquired_at.is_some(), "{usage:?}");
        let _ = s.release().await.unwrap();
    }
    Outcome::Ran
}

/// Metadata is capped at [`MAX_META`] bytes: more is refused before anything is stored; the
/// cap itself is kept whole.
pub async fn metadata_is_size_checked(h: Harness) -> Outcome {
    let r = h.resource("meta-size");
    let lock = h.lock(&r, h.ttl);
    let err = lock
        .key()
        .set_meta(Some(vec![b'x'; MAX_META + 1]))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("1025 bytes"), "{err}");
    require!(
        h.caps().metadata && h.caps().excludes,
        "the store keeps no holder metadata"
    );
    let big: Vec<u8> = (0..MAX_META).map(|i| (i % 251) as u8).collect();
    lock.key().set_meta(Some(big.clone())).unwrap();
    assert!(lock.try_acquire().await.unwrap());
    let holders = h.store.holders(&r).await.unwrap();
    assert_eq!(holding(&holders)[0].meta.as_deref(), Some(&big[..]));
    let _ = lock.release().await.unwrap();
    Outcome::Ran
}

/// `list(prefix)` lists exactly the held resources under the prefix, locks and semaphores,
/// with their holders and metadata, and forgets a resource once released. A store that
/// cannot list says so, and why.
pub async fn list_lists_exactly_what_is_held(h: Harness) -> Outcome {
    if !h.caps().lists {
        let err = h.store.list("x").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("cannot list"), "{err}");
        return Outcome::Ran;
    }
    require!(h.caps().excludes, "the store locks nothing");
    // Characters that are patterns to some stores (Redis MATCH, SQL LIKE) must match
    // themselves.
    let odd = "l*?[x]%_\\";
    let stem = h.resource(if h.can_name(odd) { odd } else { "list" });
    // `:`, not `/`: a flock semaphore's name is part of its slot files' names.
    let prefix = format!("{stem}:");
    let name = |n: &str| format!("{prefix}{n}");
    let a = h
        .lock(&name("a"), h.ttl)
        .with_meta(b"job a".to_vec())
        .unwrap();
    let b = h.lock(&name("b"), h.ttl);
    let outside = h.lock(&format!("{stem}-outside"), h.ttl);
    assert!(a.try_acquire().await.unwrap());
    let b_mode = if h.caps().shared {
        Mode::Read
    } else {
        Mode::Write
    };
    assert!(b.acquire_with(b_mode, crate::Wait::Never).await.unwrap());
    assert!(outside.try_acquire().await.unwrap());
    let released = h.lock(&name("gone"), h.ttl);
    assert!(released.try_acquire().await.unwrap());
    let _ = released.release().await.unwrap();
    let sem = match h.caps().counting {
        true => {
            let s = h.factory().create_semaphore(name("s"), 3).unwrap();
            assert!(s.try_acquire().await.unwrap());
            Some(s)
        }
        false => None,
    };

    let listed = by_name(h.store.list(&prefix).await.unwrap());
    let mut expected = vec![name("a"), name("b")];
    expected.extend(sem.as_ref().map(|_| name("s")));
    let names: Vec<&String> = listed.keys().collect();
    assert_eq!(names, expected.iter().collect::<Vec<_>>(), "{listed:#?}");
    let la = &listed[&name("a")];
    assert_eq!((la.semaphore, la.holders.len()), (None, 1), "{la:?}");
    assert_eq!(la.holders[0].mode, Mode::Write);
    if h.caps().metadata {
        assert_eq!(la.holders[0].meta.as_deref(), Some(&b"job a"[..]), "{la:?}");
        assert!(la.holders[0].acquired_at.is_some(), "{la:?}");
    }
    assert_eq!(listed[&name("b")].holders[0].mode, b_mode);
    if sem.is_some() {
        let ls = &listed[&name("s")];
        assert!(matches!(ls.semaphore, Some(3 | 0)), "{ls:?}");
        assert_eq!(ls.holders[0].permits, Some(1), "{ls:?}");
    }

    let _ = a.release().await.unwrap();
    let listed = by_name(h.store.list(&prefix).await.unwrap());
    assert!(!listed.contains_key(&name("a")), "released: {listed:#?}");
    for l in [b, outside] {
        let _ = l.release().await.unwrap();
    }
    if let Some(s) = sem {
        let _ = s.release().await.unwrap();
    }
    assert!(h.store.list(&prefix).await.unwrap().is_empty());
    if h.caps().expiring {
        expired_locks_are_not_listed(&h, &prefix).await;
    }
    Outcome::Ran
}

/// An expired holder nobody pruned yet is not listed.
async fn expired_locks_are_not_listed(h: &Harness, prefix: &str) {
    let ttl = h.time(Duration::from_millis(300));
    let lapsing = h
        .lock(&format!("{prefix}lapsing"), Some(ttl))
        .with_keep_alive(false);
    assert!(lapsing.try_acquire().await.unwrap());
    h.sleep(ttl + h.time(Duration::from_millis(200))).await;
    let listed = h.store.list(prefix).await.unwrap();
    assert!(listed.is_empty(), "an expired lock is listed: {listed:#?}");
}

fn by_name(listed: Vec<Listing>) -> BTreeMap<String, Listing> {
    let mut out = BTreeMap::new();
    for l in listed {
        assert!(l.is_held(), "listed but held by nobody: {l:?}");
        let prev = out.insert(l.resource.clone(), l);
        assert!(prev.is_none(), "listed twice: {prev:?}");
    }
    out
}

/// An observer's `watch_changes` wakes on an acquisition and on a release, and registers no
/// waiter (a lock is still taken at once while it watches).
pub async fn observers_wake_on_acquire_and_release(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("observe");
    let Some(w) = h.store.watch_changes(&r).await.unwrap() else {
        return Outcome::NotApplicable("the store cannot notify observers (they poll)");
    };
    let mut w = w;
    let idle = tokio::time::timeout(Duration::from_millis(200), &mut w).await;
    assert!(
        idle.is_err(),
        "an observer woken with nothing changed would spin"
    );
    let lock = h.lock(&r, h.ttl);
    assert!(
        lock.try_acquire().await.unwrap(),
        "an observer is not a waiter"
    );
    h.within("an observer woken by the acquisition", w).await;
    let w = h.store.watch_changes(&r).await.unwrap().unwrap();
    let _ = lock.release().await.unwrap();
    h.within("an observer woken by the release", w).await;
    Outcome::Ran
}
