//! What a newcomer writes from the docs compiles and does what it says: a factory from a DSN
//! (async and blocking alike), one ttl setter's form everywhere (a plain `Duration`, or `None`
//! for none), the blocking lock's ttl.

use std::time::Duration;

use xtr_lock::{
    ErrorKind, InMemoryStore, LockFactory, Lockable as _, MonotonicClock, RunOptions, Store as _,
};

const SECS_30: Duration = Duration::from_secs(30);

/// An in-memory store whose locks expire (and say how long they have left).
fn expiring() -> InMemoryStore {
    InMemoryStore::expiring(std::sync::Arc::new(MonotonicClock))
}

#[tokio::test]
async fn a_factory_comes_from_a_dsn_and_refuses_one_it_cannot_use() {
    let factory = LockFactory::from_dsn("in-memory").unwrap();
    assert_eq!(factory.store().to_string(), "in-memory");
    assert_eq!(factory.ttl(), Some(xtr_lock::DEFAULT_TTL));
    let lock = factory.create_lock("report");
    assert!(lock.try_acquire().await.unwrap());
    assert!(lock.release().await.unwrap().was_held());

    let err = LockFactory::from_dsn("redsi://:hunter2@cache:6379").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("did you mean \"redis:\""), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[tokio::test]
async fn every_ttl_setter_takes_a_duration_or_none() {
    let factory = LockFactory::from_dsn("in-memory")
        .unwrap()
        .with_ttl(SECS_30);
    assert_eq!(factory.ttl(), Some(SECS_30));
    let lock = factory.create_lock("r");
    assert_eq!(lock.ttl(), Some(SECS_30));
    assert_eq!(
        lock.clone().with_ttl(Duration::from_secs(5)).ttl(),
        Some(Duration::from_secs(5))
    );
    assert_eq!(lock.clone().with_ttl(None).ttl(), None);
    assert_eq!(
        lock.clone().with_ttl(Duration::ZERO).ttl(),
        None,
        "zero is none"
    );
    assert_eq!(
        lock.with_ttl(Some(SECS_30)).ttl(),
        Some(SECS_30),
        "an Option still does"
    );
    assert_eq!(factory.clone().with_ttl(None).ttl(), None);

    // RunOptions::ttl takes the same: the lock of the body has it, or none.
    let factory = LockFactory::new(expiring());
    for (ttl, expiring) in [(Some(SECS_30), true), (None, false)] {
        let store = factory.store().clone();
        let remaining = factory
            .run("run", RunOptions::new().ttl(ttl), || async move {
                let holders = store.holders("run").await?;
                Ok::<_, xtr_lock::Error>(holders[0].remaining)
            })
            .await
            .unwrap();
        assert_eq!(remaining.is_some(), expiring, "{ttl:?}: {remaining:?}");
        assert!(remaining.is_none_or(|left| left <= SECS_30));
    }
}

/// The blocking lock has the same setter (it had none), and its factory too.
#[test]
fn the_blocking_lock_and_factory_take_a_ttl_the_same_way() {
    let factory = xtr_lock::blocking::LockFactory::with_store(|| Ok(expiring()))
        .unwrap()
        .with_ttl(SECS_30);
    let lock = factory.create_lock("r");
    assert_eq!(lock.ttl(), Some(SECS_30));
    let lock = lock.with_ttl(Duration::from_secs(5));
    assert_eq!(lock.ttl(), Some(Duration::from_secs(5)));
    assert!(lock.try_acquire().unwrap());
    assert!(
        lock.remaining_lifetime()
            .is_some_and(|left| left <= Duration::from_secs(5))
    );
    assert!(lock.release().unwrap().was_held());
    assert_eq!(lock.with_ttl(None).ttl(), None);
}
