//! Counting semaphores on RedisStore against a real throwaway server: Symfony Semaphore's
//! layout, the stored limit, fencing, apart from locks, waking on release without polling, FIFO
//! for waiters that need several permits, and a waiter that gives up. (With PHP holders: the
//! `peers` binary.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use xtr_lock::{ErrorKind, LockFactory, Lockable as _, ManualClock, RedisStore, Semaphore};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, store};

fn factory(store: &RedisStore) -> LockFactory {
    LockFactory::new(store.clone()).with_ttl(Some(TTL))
}

/// Semaphores whose clock never moves: no poll and no lease-hint sleep can end, so only a
/// wake gets a waiter in.
fn frozen(store: &RedisStore) -> LockFactory {
    LockFactory::new(store.clone())
        .with_clock(Arc::new(ManualClock::frozen()))
        .with_ttl(Some(TTL))
}

fn sem(factory: &LockFactory, resource: &str, limit: u32, permits: u32) -> Semaphore {
    factory
        .create_semaphore(resource, limit)
        .unwrap()
        .permits(permits)
        .unwrap()
}

/// The members of a sorted set with their scores.
fn zset(server: &RedisServer, key: &str) -> Vec<(String, f64)> {
    let mut conn = redis::Client::open(server.url(0))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut conn)
        .unwrap()
}

/// The tickets queued on the semaphore `resource`.
fn queue(server: &RedisServer, store: &RedisStore, resource: &str) -> Vec<String> {
    let mut conn = redis::Client::open(server.url(0))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("ZRANGE")
        .arg(store.internal_key(&format!("queue:{{{resource}}}:time")))
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .unwrap()
}

/// Waits (real time, bounded) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn redis_semaphore_counts_weights_in_symfonys_two_sets_and_fences_each_holder() {
    let server = RedisServer::start();
    let store = store(&server);
    let f = factory(&store);
    let (two, one, more) = (
        sem(&f, "exp", 3, 2),
        sem(&f, "exp", 3, 1),
        sem(&f, "exp", 3, 1),
    );
    assert!(two.try_acquire().await.unwrap());
    assert!(one.try_acquire().await.unwrap());
    assert!(!more.try_acquire().await.unwrap(), "3 of 3 held");
    let weights = zset(&server, "{exp}:weight");
    let mut counts: Vec<f64> = weights.iter().map(|(_, w)| *w).collect();
    counts.sort_by(f64::total_cmp);
    assert_eq!(counts, vec![1.0, 2.0], "{weights:?}");
    let times = zset(&server, "{exp}:time");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for (_, ends) in &times {
        assert_eq!(
            ends.fract(),
            0.0,
            "whole seconds, as Symfony's EXPIREAT needs"
        );
        assert!(*ends > now + 25.0 && *ends < now + 32.0, "{ends} vs {now}");
    }
    let ttl: i64 = server.cli(&["TTL", "{exp}:time"]).parse().unwrap();
    assert!(
        (30..=42).contains(&ttl),
        "the sets live 10 s past the latest lease: {ttl}"
    );
    let usage = more.usage().await.unwrap();
    assert_eq!((usage.used, usage.limit), (3, Some(3)));
    let mut held: Vec<Option<u32>> = usage.holders.iter().map(|h| h.permits).collect();
    held.sort();
    assert_eq!(held, vec![Some(1), Some(2)]);
    assert_eq!(more.remaining().await.unwrap(), 0);
    assert!(two.fencing_token().unwrap() < one.fencing_token().unwrap());
    assert_eq!(two.release().await.unwrap(), xtr_lock::Release::Released);
    assert!(more.try_acquire().await.unwrap());
    assert!(more.fencing_token().unwrap() > one.fencing_token().unwrap());
    assert!(more.is_acquired().await.unwrap());
    more.refresh(None).await.unwrap();
    assert_eq!(more.remaining().await.unwrap(), 1);
    let _ = more.release().await.unwrap();
    let _ = one.release().await.unwrap();
    assert_eq!(server.cli(&["EXISTS", "{exp}:time", "{exp}:weight"]), "0");
}

#[tokio::test]
async fn redis_semaphore_refuses_another_limit_while_anybody_holds() {
    let server = RedisServer::start();
    let store = store(&server);
    let f = factory(&store);
    let three = sem(&f, "lim", 3, 1);
    assert!(three.try_acquire().await.unwrap());
    let four = sem(&f, "lim", 4, 1);
    let err = four.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("limit of 3") && text.contains("limit of 4"),
        "{text}"
    );
    assert!(!four.is_acquired().await.unwrap(), "nothing stored");
    let _ = three.release().await.unwrap();
    assert!(
        four.try_acquire().await.unwrap(),
        "nobody holds: the limit may change"
    );
    assert_eq!(four.usage().await.unwrap().limit, Some(4));
    assert!(three.try_acquire().await.is_err());
    let _ = four.release().await.unwrap();
}

#[tokio::test]
async fn redis_semaphore_and_lock_of_one_name_are_unrelated() {
    let server = RedisServer::start();
    let store = store(&server);
    let f = factory(&store);
    let lock = f.create_lock("same");
    assert!(lock.try_acquire().await.unwrap());
    let one = sem(&f, "same", 1, 1);
    assert!(one.try_acquire().await.unwrap(), "the lock takes no permit");
    let other = f.create_lock("same");
    assert!(
        !other.try_acquire().await.unwrap(),
        "the permit takes no lock"
    );
    let _ = lock.release().await.unwrap();
    let _ = one.release().await.unwrap();
}

#[tokio::test]
async fn redis_semaphore_waiter_is_woken_by_a_release_and_sends_nothing_while_parked() {
    let server = RedisServer::start();
    let store = store(&server);
    let f = frozen(&store);
    let holder = sem(&f, "park", 2, 2);
    holder.acquire().await.unwrap();
    let waiter = sem(&f, "park", 2, 1);
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire().await }
    });
    until("the waiter is queued", || {
        queue(&server, &store, "park").len() == 1
    })
    .await;
    let ticket = &queue(&server, &store, "park")[0];
    assert!(
        ticket.starts_with('s') && ticket.ends_with(".1"),
        "{ticket}"
    );
    server.cli(&["CONFIG", "RESETSTAT"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        server.command_calls("evalsha"),
        0,
        "a parked waiter sends nothing"
    );
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the release woke the waiter")
        .unwrap()
        .unwrap();
    assert!(waiter.is_acquired().await.unwrap());
    assert!(
        queue(&server, &store, "park").is_empty(),
        "admitted: out of the queue"
    );
    let _ = waiter.release().await.unwrap();
}

#[tokio::test]
async fn redis_semaphore_waiter_for_all_permits_is_not_starved_by_single_permit_cyclers() {
    let server = RedisServer::start();
    let store = store(&server);
    let f = factory(&store);
    let cycles = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicU32::new(0));
    let mut cyclers = Vec::new();
    for _ in 0..2 {
        let (s, cycles, stop) = (sem(&f, "fair", 3, 1), cycles.clone(), stop.clone());
        cyclers.push(tokio::spawn(async move {
            while stop.load(Ordering::SeqCst) == 0 {
                s.acquire().await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
                let _ = s.release().await.unwrap();
                cycles.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    until("the cyclers run", || cycles.load(Ordering::SeqCst) >= 10).await;
    let big = sem(&f, "fair", 3, 3);
    let before = cycles.load(Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), big.acquire())
        .await
        .expect("the 3-permit waiter got in")
        .unwrap();
    let passed = cycles.load(Ordering::SeqCst) - before;
    assert!(
        passed <= 4,
        "{passed} single-permit cycles went past the waiter"
    );
    assert_eq!(big.usage().await.unwrap().used, 3);
    stop.store(1, Ordering::SeqCst);
    let _ = big.release().await.unwrap();
    for c in cyclers {
        tokio::time::timeout(Duration::from_secs(10), c)
            .await
            .unwrap()
            .unwrap();
    }
}

#[tokio::test]
async fn redis_semaphore_newcomer_waits_behind_an_earlier_waiter_until_it_gives_up() {
    let server = RedisServer::start();
    let store = store(&server);
    let f = factory(&store);
    let holder = sem(&f, "leave", 2, 1);
    holder.acquire().await.unwrap();
    let big = sem(&f, "leave", 2, 2);
    let giving_up = tokio::spawn({
        let big = big.clone();
        async move { big.acquire_timeout(Duration::from_millis(800)).await }
    });
    until("the 2-permit waiter is queued", || {
        queue(&server, &store, "leave").len() == 1
    })
    .await;
    let newcomer = sem(&f, "leave", 2, 1);
    assert!(
        !newcomer.try_acquire().await.unwrap(),
        "a free permit, but an earlier waiter needs it"
    );
    assert!(!giving_up.await.unwrap().unwrap(), "it gave up");
    until("the waiter left the queue", || {
        queue(&server, &store, "leave").is_empty()
    })
    .await;
    assert!(newcomer.try_acquire().await.unwrap());
    let _ = newcomer.release().await.unwrap();
    let _ = holder.release().await.unwrap();
}

#[tokio::test]
async fn redis_semaphore_permit_of_a_holder_gone_silent_comes_back_at_its_ttl() {
    let server = RedisServer::start();
    let store = store(&server);
    let f = factory(&store);
    // A holder that stops doing anything: its permit stored, never released nor renewed.
    let gone = xtr_lock::Key::for_semaphore("dead", xtr_lock::Permits::new(1, 1).unwrap());
    let saved = xtr_lock::Store::save(&store, &gone, Some(Duration::from_millis(500)))
        .await
        .unwrap();
    assert!(saved.is_acquired(), "{saved:?}");
    let next = sem(&f, "dead", 1, 1);
    assert!(!next.try_acquire().await.unwrap());
    assert!(
        next.acquire_timeout(Duration::from_secs(5)).await.unwrap(),
        "the lease ended (whole seconds, rounded up)"
    );
    let _ = next.release().await.unwrap();
}
