//! Scenarios for stores whose locks expire. Time steps of 0.25 s on the harness clock, times
//! the harness's [time scale](super::Harness::with_time_scale).

use std::time::Duration;

use super::{Harness, Outcome, require};
use crate::error::{ErrorKind, LostReason};
use crate::lock::lockable::{Lockable as _, Release};
use crate::store::Holding;

const STEP: Duration = Duration::from_millis(250);

/// A put-off of 0.5 s: the lock is there after 0.25 s and gone after 0.75 s.
pub async fn put_off_lock_expires(h: Harness) -> Outcome {
    require!(h.caps().expiring, "locks do not expire");
    let k = h.key(&h.resource("put-off"));
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    assert!(
        h.store
            .put_off_expiration(&k, 2 * h.time(STEP))
            .await
            .unwrap()
            .is_held()
    );
    h.sleep(h.time(STEP)).await;
    assert!(
        h.store.exists(&k).await.unwrap().is_held(),
        "alive after 0.25 s"
    );
    h.sleep(2 * h.time(STEP)).await;
    assert!(
        !h.store.exists(&k).await.unwrap().is_held(),
        "gone after 0.75 s"
    );
    Outcome::Ran
}

/// A put-off shorter than the store's own round trip raises the expiry error and leaves
/// nothing stored.
pub async fn tiny_put_off_raises_expired(h: Harness) -> Outcome {
    require!(h.caps().expiring, "locks do not expire");
    let r = h.resource("tiny");
    let k = h.key(&r);
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    let err = h
        .store
        .put_off_expiration(&k, Duration::from_nanos(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Expired, "{err:?}");
    assert!(k.is_expired());
    assert!(!h.store.exists(&k).await.unwrap().is_held(), "taken back");
    let other = h.key(&r);
    assert!(h.store.save(&other, h.ttl).await.unwrap().is_acquired());
    h.store.delete(&other).await.unwrap();
    Outcome::Ran
}

/// Refreshing keeps the lock alive past its ttl; once refreshes stop, it expires.
pub async fn refresh_keeps_alive_then_expires(h: Harness) -> Outcome {
    require!(h.caps().expiring, "locks do not expire");
    let lock = h.lock(&h.resource("refresh"), Some(2 * h.time(STEP)));
    assert!(lock.try_acquire().await.unwrap());
    for _ in 0..4 {
        h.sleep(h.time(STEP)).await;
        lock.refresh(None).await.unwrap();
    }
    assert!(
        lock.is_acquired().await.unwrap(),
        "alive after 1 s of refreshes"
    );
    h.sleep(3 * h.time(STEP)).await;
    assert!(lock.is_expired());
    assert!(
        !lock.is_acquired().await.unwrap(),
        "expired once refreshes stopped"
    );
    assert!(
        lock.lost_reason().is_some(),
        "and the lock knows it was lost"
    );
    let err = lock.refresh(None).await.unwrap_err();
    assert!(
        err.is_lost(),
        "an expired lock cannot be refreshed, and is reported lost: {err:?}"
    );
    assert_eq!(lock.release().await.unwrap(), Release::Lost);
    Outcome::Ran
}

/// After put_off(1 s) the remaining lifetime is in (0, 1 s], and the lock is not expired.
pub async fn remaining_lifetime_after_put_off(h: Harness) -> Outcome {
    require!(h.caps().expiring, "locks do not expire");
    let lock = h.lock(
        &h.resource("remaining"),
        Some(h.time(Duration::from_secs(1))),
    );
    assert!(lock.try_acquire().await.unwrap());
    let left = lock.remaining_lifetime().expect("a lifetime");
    assert!(
        left > Duration::ZERO && left <= h.time(Duration::from_secs(1)),
        "{left:?}"
    );
    assert!(!lock.is_expired());
    lock.refresh(Some(h.time(Duration::from_secs(1))))
        .await
        .unwrap();
    let left = lock.remaining_lifetime().expect("a lifetime");
    assert!(
        left > Duration::ZERO && left <= h.time(Duration::from_secs(1)),
        "{left:?}"
    );
    let _ = lock.release().await.unwrap();
    Outcome::Ran
}

/// A key whose lifetime already ran out: save raises the expiry error, nothing is stored, and
/// another holder can then save.
pub async fn pre_expired_key_stores_nothing(h: Harness) -> Outcome {
    require!(h.caps().expiring, "locks do not expire");
    let r = h.resource("pre-expired");
    let k = h.key(&r);
    k.reduce_lifetime(Duration::ZERO);
    let err = h
        .store
        .save(&k, Some(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Expired, "{err:?}");
    assert!(!h.store.exists(&k).await.unwrap().is_held());
    let other = h.key(&r);
    assert!(
        h.store
            .save(&other, Some(Duration::from_secs(10)))
            .await
            .unwrap()
            .is_acquired()
    );
    h.store.delete(&other).await.unwrap();
    Outcome::Ran
}

/// A reader whose entry expired while another reader keeps the resource alive cannot revive
/// itself with a refresh (the Python peer's refresh revives it): the store says it expired, and
/// the lock reports the lock lost.
pub async fn expired_reader_cannot_revive_itself(h: Harness) -> Outcome {
    require!(h.caps().expiring, "locks do not expire");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("revive");
    let short = h.lock(&r, Some(h.time(Duration::from_millis(300))));
    let long = h.lock(&r, Some(Duration::from_secs(10)));
    assert!(short.try_acquire_read().await.unwrap());
    assert!(long.try_acquire_read().await.unwrap());
    h.sleep(2 * h.time(STEP)).await;
    let err = short
        .refresh(Some(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert_eq!(err.lost_reason(), Some(LostReason::Expired), "{err}");
    assert!(
        matches!(
            h.store.exists(short.key()).await.unwrap(),
            Holding::NotHeld(LostReason::TakenOver | LostReason::Removed)
        ),
        "the stale entry is gone, not kept as expired"
    );
    assert!(!short.is_acquired().await.unwrap());
    assert!(long.is_acquired().await.unwrap());
    let _ = long.release().await.unwrap();
    Outcome::Ran
}

/// A holder that never releases (crashed) loses the lock when it expires, and a blocking waiter
/// gets it then.
pub async fn waiter_takes_over_an_abandoned_lock(h: Harness) -> Outcome {
    require!(h.caps().expiring, "locks do not expire");
    let r = h.resource("abandoned");
    let crashed = h.lock(&r, Some(h.time(Duration::from_millis(300))));
    assert!(crashed.try_acquire().await.unwrap());
    let waiter = h.lock(&r, Some(Duration::from_secs(10)));
    h.within("the waiter takes over the expired lock", waiter.acquire())
        .await
        .unwrap();
    assert!(waiter.is_acquired().await.unwrap());
    assert!(!crashed.is_acquired().await.unwrap());
    let _ = waiter.release().await.unwrap();
    Outcome::Ran
}

/// A waiter that waits longer than the ttl still gets a full lease when it wins (Symfony and the
/// Python peer start the lease when the wait begins).
pub async fn long_wait_ends_with_a_full_lease(h: Harness) -> Outcome {
    require!(h.caps().expiring, "locks do not expire");
    let ttl = h.time(Duration::from_millis(600));
    let r = h.resource("full-lease");
    let holder = h.lock(&r, Some(ttl));
    assert!(holder.try_acquire().await.unwrap());
    let waiter = h.lock(&r, Some(ttl));
    let wait = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire().await }
    });
    // Hold for twice the ttl, refreshing, then let go.
    for _ in 0..6 {
        h.sleep(h.time(Duration::from_millis(200))).await;
        holder.refresh(None).await.unwrap();
    }
    assert!(!wait.is_finished(), "the waiter waited");
    let _ = holder.release().await.unwrap();
    h.within("the waiter gets the lock", wait)
        .await
        .unwrap()
        .unwrap();
    let left = waiter.remaining_lifetime().expect("a lifetime");
    assert!(
        left > ttl / 2 && left <= ttl,
        "the lease starts when the waiter wins: {left:?} left of {ttl:?}"
    );
    assert!(waiter.is_acquired().await.unwrap());
    let _ = waiter.release().await.unwrap();
    Outcome::Ran
}

/// A lock that expired and was taken over: its release reports it lost and leaves the new
/// holder alone.
pub async fn release_after_expiry_and_takeover_reports_lost(h: Harness) -> Outcome {
    require!(h.caps().expiring, "locks do not expire");
    let r = h.resource("lost");
    let first = h.lock(&r, Some(h.time(Duration::from_millis(300))));
    assert!(first.try_acquire().await.unwrap());
    h.sleep(2 * h.time(STEP)).await;
    let second = h.lock(&r, Some(Duration::from_secs(10)));
    assert!(second.try_acquire().await.unwrap());
    assert_eq!(first.release().await.unwrap(), Release::Lost);
    assert!(
        second.is_acquired().await.unwrap(),
        "the new holder keeps its lock"
    );
    let _ = second.release().await.unwrap();
    Outcome::Ran
}
