//! Counting semaphores on the Memcached store, on a real server: the slot keys, a holder that
//! cannot take all its permits giving back what it took, the limit key, names, a paused server,
//! and the scenarios every counting store runs.

use std::time::Duration;

use xtr_lock::{ErrorKind, Lock, LockFactory, MemcachedStore, Release};
use xtr_lock_testkit::memcached::MemcachedServer;

use super::sem_common::{
    a_dead_holders_permits_come_back, checker, counts, limit_rule, sem, unique,
};

fn factory(url: &str) -> LockFactory {
    LockFactory::new(MemcachedStore::from_dsn(url).unwrap()).with_ttl(Some(Duration::from_secs(30)))
}

/// The slots held, by token, as the server has them.
fn slots(server: &MemcachedServer, r: &str, limit: u32) -> Vec<Option<String>> {
    (0..limit)
        .map(|i| server.get(&format!("{r}:sem:{i}")))
        .collect()
}

/// While three holders of one permit of 3 and a lock of the same name hold: three slot keys
/// hold their tokens, the limit key says 3, the lock's key is its own.
fn layout(server: &MemcachedServer, lock: &Lock) {
    let r = lock.resource();
    let held = slots(server, r, 3);
    assert!(held.iter().all(Option::is_some), "{held:?}");
    let mut tokens: Vec<_> = held.into_iter().flatten().collect();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "one slot each");
    assert_eq!(server.get(&format!("{r}:sem:limit")).as_deref(), Some("3"));
    assert_eq!(server.get(r), Some(lock.key().token("memcached")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_semaphores() {
    let server = MemcachedServer::start();
    let f = factory(&server.url());
    counts(&f, &unique("counts"), async |lock| layout(&server, lock)).await;
    limit_rule(&f, &unique("limit")).await;
    a_dead_holders_permits_come_back(&f, &unique("dead")).await;
    checker(&f, &unique("checker")).await;
}

/// A holder of two that finds one slot free takes it and gives it back: it holds nothing, and
/// the free slot is free again for a holder of one.
#[tokio::test]
async fn a_holder_that_cannot_take_all_its_permits_gives_back_what_it_took() {
    let server = MemcachedServer::start();
    let f = factory(&server.url());
    let r = unique("partial");
    let (a, b, one) = (sem(&f, &r, 3, 2), sem(&f, &r, 3, 2), sem(&f, &r, 3, 1));
    assert!(a.try_acquire().await.unwrap());
    assert!(!b.try_acquire().await.unwrap(), "two wanted, one free");
    let held = slots(&server, &r, 3);
    let token = b.key().token("memcached");
    assert!(
        !held.contains(&Some(token)),
        "b gave its slot back: {held:?}"
    );
    assert_eq!(held.iter().flatten().count(), 2);
    assert!(one.try_acquire().await.unwrap(), "the free slot");
    assert_eq!(a.release().await.unwrap(), Release::Released);
    assert!(b.try_acquire().await.unwrap(), "two free now");
    assert_eq!(b.usage().await.unwrap().used, 3);
    assert_eq!(b.release().await.unwrap(), Release::Released);
    assert_eq!(one.release().await.unwrap(), Release::Released);
    assert_eq!(
        slots(&server, &r, 3),
        [None, None, None],
        "every slot deleted"
    );
}

/// Names whose keys Memcached cannot keep are refused before anything is sent.
#[tokio::test]
async fn semaphore_names_must_leave_room_for_the_slot_suffix() {
    let f = factory("memcached://127.0.0.1:1");
    let long = "n".repeat(241);
    let err = sem(&f, &long, 2, 1).try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = sem(&f, "with space", 2, 1).try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

/// A server paused (SIGSTOP) under an attempt: the attempt fails within the response timeout,
/// and once the server is back nothing of it is held; the holder from before still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_leaves_nothing_wrongly_held() {
    let server = MemcachedServer::start();
    let f = factory(&format!("{}?timeout=0.5", server.url()));
    let r = unique("paused");
    let (a, b) = (sem(&f, &r, 2, 1), sem(&f, &r, 2, 1));
    assert!(a.try_acquire().await.unwrap());
    server.pause();
    let err = tokio::time::timeout(Duration::from_secs(10), b.try_acquire())
        .await
        .expect("bounded by the response timeout")
        .unwrap_err();
    server.resume();
    assert!(err.is_temporary(), "{err}");
    // The holder's next call runs after its clean-up of the attempt.
    let _ = b.release().await.unwrap();
    let usage = a.usage().await.unwrap();
    assert_eq!((usage.used, usage.holders.len()), (1, 1), "{usage:?}");
    assert_eq!(
        usage.holders[0].id.as_deref(),
        a.key().holder_id("memcached").as_deref()
    );
    assert!(b.try_acquire().await.unwrap(), "the free permit is free");
    assert_eq!(a.release().await.unwrap(), Release::Released);
    assert_eq!(b.release().await.unwrap(), Release::Released);
}

/// A take that stopped halfway (an error after some of its adds, on a connection since lost)
/// leaves the holder's token on fewer slots than it asks for: its next attempt gives them
/// back and takes its permits, instead of failing as if its count had changed and leaving
/// them held by nobody until their ttl.
#[tokio::test]
async fn a_take_left_halfway_is_given_back_and_taken_whole() {
    let server = MemcachedServer::start();
    let f = factory(&server.url());
    let r = unique("halfway");
    let b = sem(&f, &r, 3, 2);
    let token = b.key().token("memcached");
    let set = format!("ms {r}:sem:2 {} T30\r\n{token}", token.len());
    assert!(
        server.command(&set).unwrap().starts_with("HD"),
        "the stray slot is set"
    );
    assert!(b.try_acquire().await.unwrap(), "two of three free");
    assert_eq!(
        b.usage().await.unwrap().used,
        2,
        "{:?}",
        slots(&server, &r, 3)
    );
    assert_eq!(b.release().await.unwrap(), Release::Released);
    assert_eq!(slots(&server, &r, 3), [None, None, None]);
}
