//! Scenarios for locks lost behind their holder's back, and for renewal: a lost lock is reported
//! through every door (the store's loss watcher, `keep_alive`, a guard, `scoped`, `run`,
//! `release`), and a held lock is kept alive for as long as a guard or scope holds it.

use std::time::Duration;

use super::{Harness, Outcome, Sabotage, require};
use crate::error::{Error, ErrorKind};
use crate::lock::lockable::{Lockable as _, Release};

/// The ttl of the lock in these scenarios on stores where locks expire: short, so that renewal
/// (which finds a loss on stores that cannot see one happen) runs several times in a test.
const SHORT_TTL: Duration = Duration::from_millis(600);

fn ttl(h: &Harness) -> Option<Duration> {
    h.caps().expiring.then_some(h.time(SHORT_TTL))
}

/// Takes the lock away from a spawned task once `started` fires, so the body is running.
fn take_away_later(
    sabotage: &Sabotage,
    key: crate::key::Key,
    started: tokio::sync::oneshot::Receiver<()>,
) {
    let sabotage = sabotage.clone();
    tokio::spawn(async move {
        if started.await.is_ok() {
            sabotage(key).await;
        }
    });
}

/// A lock taken away behind its holder's back (deleted by an outsider, its lock file replaced,
/// whatever the store can lose) is reported: by the store's loss watcher where it observes
/// loss, by `keep_alive`, by a guard's `lost()` and `unlock()`, by `scoped`, which stops its body
/// and returns `Lost` (`LockFactory::run` is `scoped` on a lock it makes), and by `release`, which
/// says `Lost`. Another holder gets the lock afterwards.
pub async fn a_lock_lost_behind_its_holders_back_is_reported(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let Some(sabotage) = h.sabotage() else {
        return Outcome::NotApplicable("the harness cannot take a lock away from its holder");
    };
    let r = h.resource("lost");
    let ttl = ttl(&h);

    // The store's own loss watcher.
    if h.caps().observes_loss {
        let lock = h.lock(&r, ttl);
        assert!(lock.try_acquire().await.unwrap());
        let watcher = h
            .store
            .watch_loss(lock.key())
            .await
            .unwrap()
            .expect("a store that observes loss gives a loss watcher");
        sabotage(lock.key().clone()).await;
        h.within("the store reports the loss", watcher).await;
        assert_eq!(lock.release().await.unwrap(), Release::Lost);
    }

    // keep_alive.
    let lock = h.lock(&r, ttl);
    assert!(lock.try_acquire().await.unwrap());
    let alive = lock.keep_alive().unwrap();
    sabotage(lock.key().clone()).await;
    let lost = h.within("keep_alive reports the loss", alive.lost()).await;
    assert_eq!(lost.resource, r);
    assert_eq!(lock.lost_reason(), Some(lost.reason), "the lock knows");
    assert_eq!(lock.held_mode(), None);
    assert_eq!(lock.release().await.unwrap(), Release::Lost);

    // A guard.
    let lock = h.lock(&r, ttl);
    let guard = lock.lock().await.unwrap();
    sabotage(lock.key().clone()).await;
    let _ = h.within("the guard reports the loss", guard.lost()).await;
    assert!(guard.is_lost());
    assert_eq!(guard.unlock().await.unwrap(), Release::Lost);

    // scoped: the body is stopped.
    let lock = h.lock(&r, ttl);
    let (started, begun) = tokio::sync::oneshot::channel();
    take_away_later(&sabotage, lock.key().clone(), begun);
    let out: Result<(), Error> = h
        .within(
            "scoped stops its body",
            lock.scoped(async move {
                let _ = started.send(());
                std::future::pending().await
            }),
        )
        .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err:?}");
    assert!(err.lost_reason().is_some());

    let other = h.lock(&r, ttl);
    assert!(other.try_acquire().await.unwrap(), "the lock is free again");
    let _ = other.release().await.unwrap();
    Outcome::Ran
}

/// A body that completes although its lock was lost while it ran (taken away during the body, with
/// no `.await` left for the monitor to stop it at) does not return `Ok`: the release finds nothing
/// and `scoped` returns `Lost`.
pub async fn a_body_whose_lock_is_lost_does_not_succeed(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let Some(sabotage) = h.sabotage() else {
        return Outcome::NotApplicable("the harness cannot take a lock away from its holder");
    };
    let r = h.resource("lost-body");
    let lock = h.lock(&r, ttl(&h));
    let key = lock.key().clone();
    let out: Result<&str, Error> = lock
        .scoped(async move {
            sabotage(key).await;
            Ok("body done")
        })
        .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err:?}");
    let other = h.lock(&r, ttl(&h));
    assert!(other.try_acquire().await.unwrap(), "the lock is free");
    let _ = other.release().await.unwrap();
    Outcome::Ran
}

/// A guard and a scope keep an expiring lock alive well past its ttl: another holder cannot take
/// it meanwhile, and the scope returns its body's value.
pub async fn guards_and_scopes_keep_an_expiring_lock_alive(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().expiring, "locks do not expire");
    let r = h.resource("kept-alive");
    let lock = h.lock(&r, Some(h.time(SHORT_TTL)));
    let other = h.lock(&r, Some(h.time(SHORT_TTL)));
    let out: Result<&str, Error> = lock
        .scoped(async {
            for _ in 0..4 {
                h.sleep(h.time(SHORT_TTL) / 2).await;
                assert!(
                    !other.try_acquire().await.unwrap(),
                    "another holder got a lock kept alive"
                );
            }
            Ok("body done")
        })
        .await;
    assert_eq!(out.unwrap(), "body done", "after more than three ttls");

    let guard = lock.lock().await.unwrap();
    h.sleep(h.time(SHORT_TTL) * 2).await;
    assert!(
        !other.try_acquire().await.unwrap(),
        "the guard kept it alive"
    );
    assert_eq!(guard.unlock().await.unwrap(), Release::Released);
    assert!(other.try_acquire().await.unwrap());
    let _ = other.release().await.unwrap();
    Outcome::Ran
}

/// A lock made without renewal is not kept alive: its scope's body is stopped when its lifetime
/// ends, with `Lost`.
pub async fn without_renewal_a_scope_ends_when_its_lock_expires(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().expiring, "locks do not expire");
    let r = h.resource("not-renewed");
    let lock = h.lock(&r, Some(h.time(SHORT_TTL))).with_keep_alive(false);
    let out: Result<(), Error> = h
        .within(
            "the body is stopped at the end of the lifetime",
            lock.scoped(std::future::pending()),
        )
        .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err:?}");
    assert_eq!(err.lost_reason(), Some(crate::error::LostReason::Expired));
    let other = h.lock(&r, Some(h.time(SHORT_TTL)));
    assert!(other.try_acquire().await.unwrap(), "the lock is free");
    let _ = other.release().await.unwrap();
    Outcome::Ran
}

/// What dropping every handle of a holder that holds does (an early `?` between acquire and
/// release): where keys travel ([`serializable_keys`](crate::store::Capabilities::serializable_keys):
/// the lock is stored data a key from another process may hold) the lock stays held, until its
/// ttl; elsewhere it is held by something of this process (a descriptor, a semaphore, a
/// database session, a subscription, a lease kept alive), which goes with the holder and lets
/// the lock go. The rule `Lock` and `Lockable` document.
pub async fn a_dropped_holder_keeps_its_lock_only_where_keys_travel(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    let resource = h.resource("dropped-holder");
    let lock = h.lock(&resource, h.ttl);
    assert!(lock.try_acquire().await.unwrap());
    let travels = h.caps().serializable_keys;
    let copy = travels.then(|| lock.key().to_json().unwrap());
    drop(lock);
    let other = h.lock(&resource, h.ttl);
    if let Some(copy) = copy {
        // A moment for a release that should not come.
        h.sleep(h.time(Duration::from_millis(200))).await;
        assert!(
            !other.try_acquire().await.unwrap(),
            "a stored lock stays held when its holder's handles go"
        );
        let key = crate::key::Key::from_json_with_clock(&copy, h.clock.clone()).unwrap();
        let again = h.factory().create_lock_from_key(key);
        assert_eq!(again.release().await.unwrap(), Release::Released);
    } else {
        h.within("the dropped holder lets the lock go", async {
            while !other.try_acquire().await.unwrap() {
                h.sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert_eq!(other.release().await.unwrap(), Release::Released);
    }
    Outcome::Ran
}
