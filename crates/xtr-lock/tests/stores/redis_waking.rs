//! Waking on Redis, functionally (counting attempts and scripts, never timing them): the wait
//! queue, one wake per release, no polling between releases of this library's holders, polling
//! beside a peer's holder, passing a wake on, and waiters in several processes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::{Lock, LockFactory, Lockable as _, ManualClock, RedisStore};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::Scripted;
use crate::support::on_redis::{TTL, frozen, queue, store, sync_conn, until};
use crate::support::peer::Peer;

#[tokio::test]
async fn a_waiter_queued_by_its_refusal_is_woken_by_the_next_release_and_sends_nothing_meanwhile() {
    let server = RedisServer::start();
    let store = store(&server);
    let factory = frozen(&store);
    let holder = factory.create_lock("q");
    holder.acquire().await.unwrap();
    let waiter = factory.create_lock("q");
    let waiting = tokio::spawn(async move {
        waiter.acquire().await.unwrap();
        waiter
    });
    until("the waiter is queued", || {
        queue(&server, &store, "q").len() == 1
    })
    .await;
    let ticket = &queue(&server, &store, "q")[0];
    assert!(ticket.starts_with('w'), "a writer's ticket: {ticket}");
    // Parked: nothing goes to the server between releases.
    server.cli(&["CONFIG", "RESETSTAT"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        server.command_calls("evalsha"),
        0,
        "a parked waiter sends nothing"
    );
    let _ = holder.release().await.unwrap();
    let waiter = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the release woke the waiter")
        .unwrap();
    assert!(waiter.is_acquired().await.unwrap());
    assert!(
        queue(&server, &store, "q").is_empty(),
        "the woken waiter left the queue"
    );
    // The release granted the lock to the waiter and woke it: it holds without a save of its
    // own (direct hand-off), and asked nothing else.
    assert_eq!(server.command_calls("evalsha"), 2, "release, is_acquired");
}

#[tokio::test]
async fn a_release_between_a_refusal_and_the_registration_is_seen_by_the_second_attempt() {
    // The interleaving driven by hand: the waiter's first attempt is refused, its registration
    // is held while the holder releases, then let go. No wake can come (the release found no
    // ticket) and no sleep can end (frozen clock): only the attempt right after the
    // registration gets the waiter in.
    let server = RedisServer::start();
    let store = store(&server);
    let holder = frozen(&store).create_lock("race");
    holder.acquire().await.unwrap();
    let scripted = Scripted::new(store.clone());
    scripted.hold_requests("watch");
    let waiter = LockFactory::from_arc(scripted.clone())
        .with_clock(Arc::new(ManualClock::frozen()))
        .with_ttl(Some(TTL))
        .create_lock("race");
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    until("refused, then registering", || {
        scripted.op_names() == ["save", "watch"]
    })
    .await;
    let _ = holder.release().await.unwrap();
    assert!(
        queue(&server, &store, "race").is_empty(),
        "nobody was queued"
    );
    scripted.release_replies();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("not stuck waiting for a wake that already happened")
        .unwrap()
        .unwrap();
    assert_eq!(scripted.op_names(), ["save", "watch", "save"]);
}

#[tokio::test]
async fn a_dropped_waiter_leaves_the_queue_and_no_wake_is_kept_for_the_next() {
    let server = RedisServer::start();
    let store = store(&server);
    let factory = frozen(&store);
    let holder = factory.create_lock("drop");
    holder.acquire().await.unwrap();
    let gone = factory.create_lock("drop");
    let waiting = tokio::spawn(async move { gone.acquire().await });
    until("queued", || queue(&server, &store, "drop").len() == 1).await;
    waiting.abort();
    let _ = waiting.await;
    until("the dropped waiter's ticket is taken out", || {
        queue(&server, &store, "drop").is_empty()
    })
    .await;
    // A release with nobody waiting wakes nobody, and keeps nothing for the next waiter: it
    // makes its two attempts and then waits for the next release.
    let _ = holder.release().await.unwrap();
    let holder = factory.create_lock("drop");
    holder.acquire().await.unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let next = factory.create_lock("drop");
    let waiting = tokio::spawn(async move {
        next.acquire().await.unwrap();
        next
    });
    until("the next waiter is queued", || {
        queue(&server, &store, "drop").len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.command_calls("evalsha"),
        2,
        "two attempts, then nothing"
    );
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_wake_for_a_waiter_that_is_gone_is_passed_on_and_dead_processes_are_skipped() {
    let server = RedisServer::start();
    let store = store(&server);
    let factory = frozen(&store);
    let holder = factory.create_lock("pass");
    holder.acquire().await.unwrap();
    let waiter = factory.create_lock("pass");
    let waiting = tokio::spawn(async move {
        waiter.acquire().await.unwrap();
        waiter
    });
    until("queued", || queue(&server, &store, "pass").len() == 1).await;
    let real = queue(&server, &store, "pass").remove(0);
    // Ahead of it: a ticket of a process that went away (nobody listens to its channel), and
    // one of this store whose waiter is not here (as one whose clean-up never reached the
    // server): the first is skipped, the second passed on.
    let (mode_token, rest) = real.split_at(45);
    let (id, _seq) = rest.split_at(22);
    let dead = format!("{mode_token}{}7", "A".repeat(22));
    let orphan = format!("{mode_token}{id}999999");
    let key = store.internal_key("queue:pass");
    let mut conn = sync_conn(&server);
    let _: i64 = redis::cmd("ZADD")
        .arg(&key)
        .arg(1)
        .arg(&dead)
        .arg(2)
        .arg(&orphan)
        .query(&mut conn)
        .unwrap();
    assert_eq!(queue(&server, &store, "pass"), [dead, orphan, real]);
    let _ = holder.release().await.unwrap();
    let waiter = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the wake reached the real waiter")
        .unwrap();
    assert!(waiter.is_acquired().await.unwrap());
    assert!(queue(&server, &store, "pass").is_empty());
}

#[tokio::test]
async fn a_writers_release_wakes_every_waiting_reader() {
    let server = RedisServer::start();
    let store = store(&server);
    let factory = frozen(&store);
    let writer = factory.create_lock("readers");
    writer.acquire().await.unwrap();
    let mut readers = Vec::new();
    for _ in 0..5 {
        let reader = factory.create_lock("readers");
        readers.push(tokio::spawn(async move {
            reader.acquire_read().await.unwrap();
            reader
        }));
    }
    until("all queued", || {
        queue(&server, &store, "readers").len() == 5
    })
    .await;
    server.cli(&["CONFIG", "RESETSTAT"]);
    let _ = writer.release().await.unwrap();
    for r in readers {
        let r = tokio::time::timeout(Duration::from_secs(10), r)
            .await
            .unwrap()
            .unwrap();
        assert!(r.is_acquired().await.unwrap());
    }
    // One release, five saves, five checks: no reader tried twice.
    assert_eq!(server.command_calls("evalsha"), 11);
}

#[tokio::test]
async fn beside_a_python_holder_a_waiter_polls_and_gets_the_lock_when_it_releases() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut py = Peer::python("redis", &server.url(0));
    assert_eq!(py.call_ttl("try_write", "py", Some(30.0)), true);
    let waiter: Lock = LockFactory::new(store.clone())
        .with_ttl(Some(TTL))
        .create_lock("py");
    let waiting = tokio::spawn(async move {
        waiter.acquire().await.unwrap();
        waiter
    });
    until("queued", || queue(&server, &store, "py").len() == 1).await;
    // The Python holder never announces its release: the waiter polls, about ten times a
    // second (counted, not timed: at least a few tries in half a second).
    server.cli(&["CONFIG", "RESETSTAT"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(server.command_calls("evalsha") >= 2, "the waiter polls");
    py.call("release", "py");
    let waiter = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the poll found the lock free")
        .unwrap();
    assert!(waiter.is_acquired().await.unwrap());
    assert!(queue(&server, &store, "py").is_empty(), "it left the queue");
}

/// A store whose first waits start in three slots at once (three masters) opens one subscriber
/// connection for them: each release wakes its waiter, long before the 30 s lease hint that a
/// lost wake would leave the waiter with.
#[tokio::test]
async fn first_waits_in_several_cluster_slots_at_once_are_all_woken() {
    let cluster = xtr_lock_testkit::redis_cluster::RedisCluster::start(3, 0);
    let holders = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let waiters = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    // "a", "b" and "c" are on three different masters of an evenly split cluster.
    let names = ["a", "b", "c"];
    let held: Vec<Lock> = names.iter().map(|n| lock_on(&holders, n)).collect();
    for l in &held {
        assert!(l.try_acquire().await.unwrap());
    }
    let tasks: Vec<_> = names
        .iter()
        .flat_map(|n| std::iter::repeat_n(*n, 3))
        .map(|n| {
            let l = lock_on(&waiters, n);
            tokio::spawn(async move {
                assert!(l.acquire_timeout(Duration::from_secs(60)).await.unwrap());
                let _ = l.release().await.unwrap();
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    for l in &held {
        let _ = l.release().await.unwrap();
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a waiter slept until its lease hint: {:?}",
        started.elapsed()
    );
}

fn lock_on(store: &RedisStore, resource: &str) -> Lock {
    LockFactory::new(store.clone())
        .create_lock(resource)
        .with_ttl(Some(TTL))
}
