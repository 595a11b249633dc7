//! What a holder believes about its lease while the store is slow (issue 31): a renewal in
//! flight is not a renewal. Until the store confirms it, `remaining_lifetime()` is the lease
//! from before (which the store alone keeps if the renewal never lands), and a renewal the
//! store never answers does not lengthen it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use xtr_lock::{LockFactory, Lockable as _, MemcachedStore};
use xtr_lock_testkit::hook_proxy::HeldRequest;
use xtr_lock_testkit::memcached::MemcachedServer;

/// How long the proxy holds the renewal back: well within the request timeout (5 s).
const HELD: Duration = Duration::from_millis(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_in_flight_does_not_lengthen_the_lease_until_it_is_confirmed() {
    let server = MemcachedServer::start();
    let renewing = Arc::new(AtomicBool::new(false));
    let armed = renewing.clone();
    // Holds back the first request sent once the test says the renewal begins.
    let (port, held) = HeldRequest::start(server.port(), HELD, move |_, _| {
        armed.load(Ordering::SeqCst)
    });
    let store = MemcachedStore::from_dsn(&format!("memcached://127.0.0.1:{port}")).unwrap();
    let lock = LockFactory::new(store)
        .with_ttl(Some(Duration::from_secs(4)))
        .create_lock(format!("liveness-{:08x}", rand::random::<u32>()));
    assert!(lock.try_acquire().await.unwrap());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = lock.remaining_lifetime().expect("a lease");
    renewing.store(true, Ordering::SeqCst);
    let renewal = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.refresh(None).await })
    };
    // While the store has not answered, the lease believed is the one from before.
    while held.arrived().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..4 {
        let now = lock.remaining_lifetime().expect("a lease");
        assert!(
            now <= before,
            "an unconfirmed renewal lengthened the lease: {now:?} left, {before:?} before it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    renewal.await.unwrap().expect("the renewal lands");
    let after = lock.remaining_lifetime().expect("a lease");
    assert!(
        after > before,
        "confirmed, the renewal counts: {after:?} left, {before:?} before it"
    );
    let _ = lock.release().await.unwrap();
}
