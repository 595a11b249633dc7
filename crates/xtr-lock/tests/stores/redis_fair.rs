//! Fair waiting on Redis: waiters served in arrival order, a waiting writer ahead of the readers
//! that came after it, no newcomer past a live queued waiter, and a queue that a dead or gone
//! waiter cannot stall; peers that barge never break exclusion. Orders are checked, never
//! timed: each waiter is registered (its ticket seen in the queue) before the next comes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use xtr_lock::{Lock, LockFactory, Lockable as _, ManualClock, RedisStore, Store as _};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, store};
use crate::support::peer::Peer;
use crate::support::sections::Sections;

fn sync_conn(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url(0))
        .unwrap()
        .get_connection()
        .unwrap()
}

/// The tickets in `resource`'s wait queue, first first.
fn queue(server: &RedisServer, store: &RedisStore, resource: &str) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(store.internal_key(&format!("queue:{resource}")))
        .arg(0)
        .arg(-1)
        .query(&mut sync_conn(server))
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

/// Locks whose clock never moves: only a wake gets a waiter in (no poll, no lease hint).
fn frozen(store: &RedisStore) -> LockFactory {
    LockFactory::new(store.clone())
        .with_clock(Arc::new(ManualClock::frozen()))
        .with_ttl(Some(TTL))
}

/// A waiter that records `name` in `order` once it holds, then releases.
fn waiter(
    lock: Lock,
    read: bool,
    name: String,
    order: &Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    let order = order.clone();
    tokio::spawn(async move {
        if read {
            lock.acquire_read().await.unwrap();
        } else {
            lock.acquire().await.unwrap();
        }
        order.lock().unwrap().push(name);
        let _ = lock.release().await.unwrap();
    })
}

#[tokio::test]
async fn waiters_are_served_in_the_order_they_came() {
    let server = RedisServer::start();
    let store = store(&server);
    assert!(store.capabilities().fair);
    let factory = frozen(&store);
    let holder = factory.create_lock("fifo");
    holder.acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut ids = Vec::new();
    for i in 0..8 {
        let lock = factory.create_lock("fifo");
        let _ = lock.key().token("redis");
        ids.push(lock.key().holder_id("redis"));
        tasks.push(waiter(lock, false, i.to_string(), &order));
        until("the waiter is queued", || {
            queue(&server, &store, "fifo").len() == i + 1
        })
        .await;
    }
    // `holders` shows the queue, in its order, after who holds.
    let shown = store.holders("fifo").await.unwrap();
    assert!(!shown[0].waiting);
    let waiting: Vec<_> = shown[1..].iter().map(|h| h.id.clone()).collect();
    assert!(shown[1..].iter().all(|h| h.waiting));
    assert_eq!(waiting, ids);
    let _ = holder.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .unwrap()
            .unwrap();
    }
    let expected: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    assert_eq!(*order.lock().unwrap(), expected);
}

#[tokio::test]
async fn a_waiting_writer_goes_before_every_reader_that_came_after_it() {
    let server = RedisServer::start();
    let store = store(&server);
    let factory = frozen(&store);
    let reading = factory.create_lock("rw");
    reading.acquire_read().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let writer = waiter(factory.create_lock("rw"), false, "w".into(), &order);
    until("the writer is queued", || {
        queue(&server, &store, "rw").len() == 1
    })
    .await;
    // A stream of readers: while the writer waits, none gets in, not even with a try.
    let newcomer = factory.create_lock("rw");
    assert!(!newcomer.try_acquire_read().await.unwrap());
    let mut readers = Vec::new();
    for i in 0..5 {
        readers.push(waiter(
            factory.create_lock("rw"),
            true,
            format!("r{i}"),
            &order,
        ));
        until("the reader is queued", || {
            queue(&server, &store, "rw").len() == i + 2
        })
        .await;
    }
    assert!(
        order.lock().unwrap().is_empty(),
        "nobody got in past the held read lock"
    );
    let _ = reading.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), writer)
        .await
        .unwrap()
        .unwrap();
    for r in readers {
        tokio::time::timeout(Duration::from_secs(20), r)
            .await
            .unwrap()
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order[0], "w", "{order:?}");
    assert_eq!(order.len(), 6);
    assert!(queue(&server, &store, "rw").is_empty());
}

/// A queued ticket for a waiter that lives in another "process": a connection that listens on
/// its store channel (`id`), as a live waiting store does.
async fn live_ticket(
    server: &RedisServer,
    store: &RedisStore,
    resource: &str,
    id: &str,
) -> redis::aio::PubSub {
    let client = redis::Client::open(server.url(0)).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub
        .subscribe(format!("__xtr_lock__:wake:{id}"))
        .await
        .unwrap();
    let ticket = format!("w{}={id}1", "A".repeat(43));
    let _: i64 = redis::cmd("ZADD")
        .arg(store.internal_key(&format!("queue:{resource}")))
        .arg(1)
        .arg(ticket)
        .query(&mut sync_conn(server))
        .unwrap();
    pubsub
}

#[tokio::test]
async fn a_newcomer_does_not_take_a_free_lock_past_a_live_waiter_and_a_dead_one_stalls_nobody() {
    let server = RedisServer::start();
    let store = store(&server);
    let id = "B".repeat(22);
    let mut other = live_ticket(&server, &store, "head", &id).await;
    let newcomer = LockFactory::new(store.clone())
        .with_ttl(Some(TTL))
        .create_lock("head");
    assert!(
        !newcomer.try_acquire().await.unwrap(),
        "the queued waiter goes first"
    );
    let waiting = tokio::spawn(async move {
        assert!(
            newcomer
                .acquire_timeout(Duration::from_secs(30))
                .await
                .unwrap()
        );
        newcomer
    });
    // The refused newcomer wakes the head of the queue again (its wake may have been lost).
    let wake = tokio::time::timeout(Duration::from_secs(10), other.on_message().next())
        .await
        .expect("the head is woken")
        .unwrap();
    let payload: String = wake.get_payload().unwrap();
    assert!(payload.starts_with(&format!("{id}1 ")), "{payload}");
    assert!(!waiting.is_finished());
    // The other process dies: nobody listens on its channel, and its ticket is dropped.
    drop(other);
    let newcomer = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the dead waiter does not stall the queue")
        .unwrap();
    assert!(newcomer.is_acquired().await.unwrap());
    assert!(queue(&server, &store, "head").is_empty());
}

#[tokio::test]
async fn a_ticket_whose_waiter_left_a_live_process_is_passed_on() {
    let server = RedisServer::start();
    let store = store(&server);
    // The other store's channel is subscribed by one of its waiters elsewhere.
    let elsewhere = RedisStore::from_dsn(&server.url(0)).unwrap();
    let held = frozen(&elsewhere).create_lock("elsewhere");
    held.acquire().await.unwrap();
    let blocked = frozen(&elsewhere).create_lock("elsewhere");
    let _blocked = tokio::spawn(async move { blocked.acquire().await });
    until("queued elsewhere", || {
        queue(&server, &elsewhere, "elsewhere").len() == 1
    })
    .await;
    let ticket = queue(&server, &elsewhere, "elsewhere").remove(0);
    // A ticket of that store for a waiter it no longer has (its clean-up never reached the
    // server), at the head of a free lock's queue.
    let orphan = format!("{}999999", &ticket[..67]);
    let _: i64 = redis::cmd("ZADD")
        .arg(store.internal_key("queue:orphan"))
        .arg(1)
        .arg(&orphan)
        .query(&mut sync_conn(&server))
        .unwrap();
    let newcomer = LockFactory::new(store.clone())
        .with_ttl(Some(TTL))
        .create_lock("orphan");
    assert!(
        newcomer
            .acquire_timeout(Duration::from_secs(20))
            .await
            .unwrap(),
        "the orphan's store passes its wake on"
    );
    assert!(queue(&server, &store, "orphan").is_empty());
}

#[tokio::test]
async fn with_fair_false_a_newcomer_goes_first() {
    let server = RedisServer::start();
    let store = RedisStore::from_dsn(&format!("{}?fair=false", server.url(0))).unwrap();
    assert!(!store.capabilities().fair);
    let _other = live_ticket(&server, &store, "barge", &"C".repeat(22)).await;
    let newcomer = LockFactory::new(store.clone())
        .with_ttl(Some(TTL))
        .create_lock("barge");
    assert!(newcomer.try_acquire().await.unwrap());
}

/// Python holders know nothing of the queue and take a free lock whenever they ask: they never
/// share it with ours (a marker file each side creates exclusively inside its section).
#[tokio::test]
async fn python_holders_barging_past_the_queue_never_overlap_ours() {
    let server = RedisServer::start();
    let store = store(&server);
    let dir = tempfile::tempdir().unwrap();
    let sections = Sections::new(dir.path());
    let url = server.url(0);
    let py_sections = sections.clone();
    let python = tokio::task::spawn_blocking(move || {
        let mut py = Peer::python("redis", &url);
        for _ in 0..25 {
            assert_eq!(py.call_ttl("wait_write", "mixed", Some(30.0)), true);
            let inside = py_sections.enter("mixed", 0, "python");
            std::thread::sleep(Duration::from_millis(2));
            inside.leave();
            py.call("release", "mixed");
        }
    });
    let mut ours = Vec::new();
    for n in 0..4 {
        let lock = LockFactory::new(store.clone())
            .with_ttl(Some(TTL))
            .create_lock("mixed");
        let sections = sections.clone();
        ours.push(tokio::spawn(async move {
            for _ in 0..25 {
                lock.acquire().await.unwrap();
                let inside = sections.enter("mixed", 0, &format!("rust-{n}"));
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.leave();
                let _ = lock.release().await.unwrap();
            }
        }));
    }
    for t in ours {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .unwrap()
            .unwrap();
    }
    tokio::time::timeout(Duration::from_secs(120), python)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sections.tokens("mixed").len(), 125, "every section ran");
}
