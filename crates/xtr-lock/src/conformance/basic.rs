//! Scenarios every store that locks must pass.

use std::time::Duration;

use super::{Harness, Outcome, require};
use crate::error::ErrorKind;
use crate::key::Key;
use crate::lock::lockable::Lockable as _;
use crate::lock::lockable::Release;

/// A holder that has not saved does not exist; after save it does; after delete it does not,
/// and a second delete reports that nothing was removed.
pub async fn save_exists_delete(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("basic");
    let k = h.key(&r);
    assert!(
        !h.store.exists(&k).await.unwrap().is_held(),
        "exists before save"
    );
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    assert!(
        h.store.exists(&k).await.unwrap().is_held(),
        "exists after save"
    );
    assert!(h.store.delete(&k).await.unwrap(), "delete removes the lock");
    assert!(
        !h.store.exists(&k).await.unwrap().is_held(),
        "exists after delete"
    );
    assert!(
        !h.store.delete(&k).await.unwrap(),
        "second delete removes nothing"
    );
    Outcome::Ran
}

/// Locks on different resources are independent.
pub async fn independent_resources(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let (a, b) = (h.key(&h.resource("a")), h.key(&h.resource("b")));
    assert!(h.store.save(&a, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.save(&b, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.exists(&a).await.unwrap().is_held());
    assert!(h.store.exists(&b).await.unwrap().is_held());
    h.store.delete(&a).await.unwrap();
    assert!(
        h.store.exists(&b).await.unwrap().is_held(),
        "b survives a's delete"
    );
    h.store.delete(&b).await.unwrap();
    Outcome::Ran
}

/// On one resource a second holder's save conflicts and does not disturb the first; once the
/// first deletes, the second can save. A delete by the second never removes the first's lock.
pub async fn second_holder_conflicts_until_the_first_deletes(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("conflict");
    let (a, b) = (h.key(&r), h.key(&r));
    assert!(h.store.save(&a, h.ttl).await.unwrap().is_acquired());
    let refused = h.store.save(&b, h.ttl).await.unwrap();
    assert!(refused.is_conflict(), "{refused:?}");
    assert_eq!(
        refused.conflict().unwrap().kept,
        None,
        "the refused holder holds nothing"
    );
    assert!(
        h.store.exists(&a).await.unwrap().is_held(),
        "first holder undisturbed"
    );
    assert!(!h.store.exists(&b).await.unwrap().is_held());
    assert!(
        !h.store.delete(&b).await.unwrap(),
        "b's delete removes nothing"
    );
    assert!(
        h.store.exists(&a).await.unwrap().is_held(),
        "b's delete left a's lock"
    );
    h.store.delete(&a).await.unwrap();
    assert!(h.store.save(&b, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.exists(&b).await.unwrap().is_held());
    h.store.delete(&b).await.unwrap();
    Outcome::Ran
}

/// The same holder can save twice.
pub async fn same_holder_saves_twice(h: Harness) -> Outcome {
    let r = h.resource("twice");
    let k = h.key(&r);
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    assert_eq!(
        h.store.exists(&k).await.unwrap().is_held(),
        h.caps().excludes
    );
    h.store.delete(&k).await.unwrap();
    Outcome::Ran
}

/// A delete on another resource leaves this holder's lock untouched.
pub async fn delete_on_another_resource_leaves_the_lock(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let a = h.key(&h.resource("mine"));
    let other = h.key(&h.resource("other"));
    assert!(h.store.save(&a, h.ttl).await.unwrap().is_acquired());
    h.store.delete(&other).await.unwrap();
    assert!(h.store.exists(&a).await.unwrap().is_held());
    h.store.delete(&a).await.unwrap();
    Outcome::Ran
}

/// A serialized and deserialized copy of a key is the same holder: it sees the lock, re-saves
/// at once, and its delete releases the original's lock.
pub async fn deserialized_key_is_the_same_holder(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(
        h.caps().serializable_keys,
        "keys of this store cannot travel"
    );
    let r = h.resource("travel");
    let k = h.key(&r);
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    let copy = Key::from_json_with_clock(&k.to_json().unwrap(), h.clock.clone()).unwrap();
    assert!(
        h.store.exists(&copy).await.unwrap().is_held(),
        "the copy holds"
    );
    assert!(h.store.save(&copy, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.delete(&copy).await.unwrap(), "the copy releases");
    assert!(
        !h.store.exists(&k).await.unwrap().is_held(),
        "for the original too"
    );
    Outcome::Ran
}

/// After a save, a key holding process-local state refuses to serialize, even after release.
pub async fn key_is_unserializable_after_save(h: Harness) -> Outcome {
    require!(!h.caps().serializable_keys, "keys of this store serialize");
    let k = h.key(&h.resource("local"));
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    let err = k.to_json().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnserializableKey);
    h.store.delete(&k).await.unwrap();
    assert_eq!(
        k.to_json().unwrap_err().kind(),
        ErrorKind::UnserializableKey
    );
    Outcome::Ran
}

/// Odd resource names are ordinary resources: they lock, exclude and release like any other, and
/// do not collide with each other. A store with a name rule refuses the names outside it, as an
/// invalid argument in one line.
pub async fn odd_resource_names(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let base = h.resource("odd");
    let names = [
        String::new(),
        "..".to_owned(),
        "/".to_owned(),
        "a/../../etc/passwd".to_owned(),
        "nul\0byte".to_owned(),
        "line\nbreak".to_owned(),
        "émoji 🔒 ß".to_owned(),
        "x".repeat(10 * 1024),
    ];
    let mut held = Vec::new();
    for n in &names {
        // The empty name is used bare, so that stores see exactly it (each test has its own
        // store or server); the others get a unique prefix.
        let r = if n.is_empty() {
            n.clone()
        } else {
            format!("{base}{n}")
        };
        let (a, b) = (h.key(&r), h.key(&r));
        let lock_a = h.factory().create_lock_from_key(a);
        if !h.can_name(&r) {
            let err = lock_a.try_acquire().await.unwrap_err();
            assert_eq!(
                err.kind(),
                crate::ErrorKind::InvalidArgument,
                "{r:?}: {err}"
            );
            assert!(!err.to_string().contains('\n'), "one line: {err}");
            assert!(!lock_a.is_acquired().await.unwrap_or(false));
            continue;
        }
        assert!(lock_a.try_acquire().await.unwrap(), "{r:?} acquires");
        let lock_b = h.factory().create_lock_from_key(b);
        assert!(!lock_b.try_acquire().await.unwrap(), "{r:?} excludes");
        held.push(lock_a);
    }
    for lock in held {
        assert_eq!(lock.release().await.unwrap(), Release::Released);
    }
    Outcome::Ran
}

/// Acquiring what the holder holds succeeds at once; locks from one key are one holder; one
/// release lets go for all (no counting); two `create_lock` calls are two holders.
pub async fn reentrant_acquire_and_no_counting(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("reentrant");
    let a = h.lock(&r, h.ttl);
    let a_too = h.factory().create_lock_from_key(a.key().clone());
    let b = h.lock(&r, h.ttl);
    assert!(a.try_acquire().await.unwrap());
    assert!(a.try_acquire().await.unwrap(), "re-acquire");
    h.within("re-acquire by a blocking acquire", a_too.acquire())
        .await
        .unwrap();
    assert!(
        !b.try_acquire().await.unwrap(),
        "another create_lock is another holder"
    );
    assert_eq!(a.release().await.unwrap(), Release::Released);
    assert!(
        !a_too.is_acquired().await.unwrap(),
        "one release lets go for all"
    );
    assert!(b.try_acquire().await.unwrap());
    let _ = b.release().await.unwrap();
    Outcome::Ran
}

/// Refreshing a lock that was never acquired is a conflict (the holder is then not held).
pub async fn refresh_of_a_lock_never_acquired_is_a_conflict(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let lock = h.lock(&h.resource("refresh-never"), h.ttl);
    let err = lock
        .refresh(Some(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err:?}");
    // Nobody holds it: the message must not say someone else does.
    let said = err.to_string();
    assert!(
        said.contains("not held") && !said.contains("someone else"),
        "{said}"
    );
    assert!(!lock.is_acquired().await.unwrap());
    Outcome::Ran
}

/// On a store without expiry, refresh only checks that the holder still holds; the remaining
/// lifetime stays none.
pub async fn refresh_on_a_non_expiring_store_checks_the_hold(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(!h.caps().expiring, "the store expires locks");
    let lock = h.lock(&h.resource("refresh-hold"), Some(Duration::from_secs(10)));
    assert!(lock.try_acquire().await.unwrap());
    lock.refresh(None).await.unwrap();
    lock.refresh(Some(Duration::from_secs(1))).await.unwrap();
    assert_eq!(lock.remaining_lifetime(), None);
    assert!(!lock.is_expired());
    let _ = lock.release().await.unwrap();
    let err = lock.refresh(None).await.unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    Outcome::Ran
}

/// Release tells what it found: nothing held, released, and (by a lock believed held whose
/// store entry is gone) lost; it never touches another holder.
pub async fn release_reports_what_it_found(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("release");
    let lock = h.lock(&r, h.ttl);
    assert_eq!(lock.release().await.unwrap(), Release::NotHeld);
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert_eq!(
        lock.release().await.unwrap(),
        Release::NotHeld,
        "released twice"
    );
    // Believed held, but a deserialized copy of the holder released it behind its back.
    if h.caps().serializable_keys {
        assert!(lock.try_acquire().await.unwrap());
        let copy =
            Key::from_json_with_clock(&lock.key().to_json().unwrap(), h.clock.clone()).unwrap();
        h.store.delete(&copy).await.unwrap();
        let other = h.lock(&r, h.ttl);
        assert!(other.try_acquire().await.unwrap());
        assert_eq!(lock.release().await.unwrap(), Release::Lost);
        assert!(
            other.is_acquired().await.unwrap(),
            "the new holder keeps its lock"
        );
        let _ = other.release().await.unwrap();
    }
    Outcome::Ran
}

/// A scope releases on the way out when the body fails and when it panics; a nested scope
/// keeps the lock; a lock acquired before the scope stays held.
pub async fn scoped_use_releases_on_error_and_panic(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let r = h.resource("scoped");
    let lock = h.lock(&r, h.ttl);
    let other = h.lock(&r, h.ttl);

    let out: Result<(), crate::Error> = lock
        .scoped(async { Err(crate::Error::invalid_argument("body failed")) })
        .await;
    assert_eq!(out.unwrap_err().reason(), Some("body failed"));
    assert!(
        other.try_acquire().await.unwrap(),
        "released after the body's error"
    );
    let _ = other.release().await.unwrap();

    let panicked = tokio::spawn({
        let lock = lock.clone();
        async move {
            let _: Result<(), crate::Error> = lock.scoped(async { panic!("body panicked") }).await;
        }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert!(
        h.within("release after a panic", other.acquire())
            .await
            .is_ok(),
        "released after the body's panic"
    );
    let _ = other.release().await.unwrap();

    // Nested scopes: the inner exit keeps the lock, the outer releases it.
    let inner_kept = lock
        .scoped(async {
            lock.scoped(async { Ok::<_, crate::Error>(()) }).await?;
            lock.is_acquired().await
        })
        .await
        .unwrap();
    assert!(inner_kept, "the inner scope kept the lock");
    assert!(
        !lock.is_acquired().await.unwrap(),
        "the outer scope released it"
    );

    // A lock acquired before the scope stays held.
    assert!(lock.try_acquire().await.unwrap());
    lock.scoped(async { Ok::<_, crate::Error>(()) })
        .await
        .unwrap();
    assert!(lock.is_acquired().await.unwrap());
    let _ = lock.release().await.unwrap();
    Outcome::Ran
}

/// Introspection, where the store has it: nobody before; a writer shows as one write holder
/// whose lease is no longer than its ttl; two readers as two read holders (with different ids
/// where the store knows ids); nobody after the releases.
pub async fn holders_tell_who_holds(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(
        h.caps().introspection,
        "the store cannot tell who holds a lock"
    );
    let r = h.resource("holders");
    let none = |hs: &[crate::store::HolderInfo]| hs.is_empty();
    assert!(none(&h.store.holders(&r).await.unwrap()), "nobody yet");
    let w = h.key(&r);
    assert!(h.store.save(&w, h.ttl).await.unwrap().is_acquired());
    let hs = h.store.holders(&r).await.unwrap();
    assert_eq!(hs.len(), 1, "one writer: {hs:?}");
    assert_eq!(hs[0].mode, crate::key::Mode::Write, "{hs:?}");
    if let (Some(ttl), Some(left)) = (h.ttl, hs[0].remaining) {
        assert!(left <= ttl, "{left:?} left of a {ttl:?} lease");
    }
    h.store.delete(&w).await.unwrap();
    let hs = h.store.holders(&r).await.unwrap();
    assert!(none(&hs), "released: {hs:?}");
    if h.caps().shared {
        let (a, b) = (h.key(&r), h.key(&r));
        assert!(h.store.save_read(&a, h.ttl).await.unwrap().is_acquired());
        assert!(h.store.save_read(&b, h.ttl).await.unwrap().is_acquired());
        let hs = h.store.holders(&r).await.unwrap();
        assert_eq!(hs.len(), 2, "two readers: {hs:?}");
        assert!(
            hs.iter().all(|x| x.mode == crate::key::Mode::Read),
            "{hs:?}"
        );
        if let (Some(x), Some(y)) = (&hs[0].id, &hs[1].id) {
            assert_ne!(x, y, "two holders, two ids");
        }
        h.store.delete(&a).await.unwrap();
        h.store.delete(&b).await.unwrap();
        let hs = h.store.holders(&r).await.unwrap();
        assert!(none(&hs), "both released: {hs:?}");
    }
    Outcome::Ran
}
