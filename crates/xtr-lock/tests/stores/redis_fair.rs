//! Fair waiting on Redis: waiters served in arrival order, a waiting writer ahead of the readers
//! that came after it, no newcomer past a live queued waiter, and a queue that a dead or gone
//! waiter cannot stall; peers that barge never break exclusion. Orders are checked, never
//! timed: each waiter is registered (its ticket seen in the queue) before the next comes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use xtr_lock::{Lock, LockFactory, Lockable as _, ManualClock, RedisStore, Store as _};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, frozen, queue, queue_in, store, sync_conn, until};
use crate::support::peer::Peer;
use crate::support::sections::Sections;

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

/// Found in review: a reader waiting to be promoted is never woken when the other
/// reader releases. Its promotion's ticket (`w`) heads the queue, but `wake_next` sees a live
/// entry (the promoter's own read entry) and wakes nobody: the promoter gets in only when the
/// other reader's lease hint ends (never, on a frozen clock), although nothing stands in its
/// way from the release on.
#[tokio::test]
async fn a_promoting_reader_is_woken_when_the_other_reader_releases() {
    let server = RedisServer::start();
    let store = store(&server);
    let factory = frozen(&store);
    let promoter = factory.create_lock("promote");
    let other = factory.create_lock("promote");
    promoter.acquire_read().await.unwrap();
    other.acquire_read().await.unwrap();
    let promoting = tokio::spawn(async move {
        promoter.acquire().await.unwrap();
        promoter
    });
    until("the promotion is queued", || {
        queue(&server, &store, "promote").len() == 1
    })
    .await;
    let _ = other.release().await.unwrap();
    let promoter = tokio::time::timeout(Duration::from_secs(20), promoting)
        .await
        .expect("the sole reader left is promoted once the other released")
        .unwrap();
    assert!(promoter.is_acquired().await.unwrap());
}

/// A quorum's waiter keeps its tickets (and so its place) on its members when woken: the
/// members' registrations live as long as the quorum's watcher. They do only because the
/// quorum's watcher keeps each member's coverage, which owns the member's `WatchGuard`; the
/// future that fires drops the members' watchers themselves. (Before, each wake dropped them:
/// `LEAVE` on every member, next waiter woken, a new ticket number on the next save.)
///
/// The holder lets its lock run out later (`release_after` wakes every waiter and keeps their
/// tickets); the waiter's ticket is taken out of member 0's queue beforehand only so that its
/// next (refused) save there shows, deterministically, which ticket it now sends.
#[tokio::test]
async fn a_quorum_waiter_keeps_its_tickets_when_woken() {
    let server = RedisServer::start();
    let members: Vec<RedisStore> = (0..3)
        .map(|db| RedisStore::from_dsn(&server.url(db)).unwrap())
        .collect();
    let dyns: Vec<Arc<dyn xtr_lock::Store>> = members
        .iter()
        .map(|m| Arc::new(m.clone()) as Arc<dyn xtr_lock::Store>)
        .collect();
    let quorum = Arc::new(
        xtr_lock::store::CombinedStore::new(dyns, xtr_lock::store::ConsensusStrategy).unwrap(),
    );
    let held = xtr_lock::Key::new("q");
    assert!(quorum.save(&held, Some(TTL)).await.unwrap().is_acquired());
    let waiter = LockFactory::new(quorum.clone())
        .with_clock(Arc::new(ManualClock::frozen()))
        .with_ttl(Some(TTL))
        .create_lock("q");
    let _waiting = tokio::spawn(async move { waiter.acquire().await });
    // Queued on a quorum: on whichever two members registered before the attempt (the third
    // member's registration may come after it).
    let queued_on = || -> Vec<usize> {
        (0..3)
            .filter(|&db| queue_in(&server, db as u32, &members[db], "q").len() == 1)
            .collect()
    };
    until("queued on a quorum", || queued_on().len() >= 2).await;
    let m = queued_on()[0];
    let ticket = queue_in(&server, m as u32, &members[m], "q").remove(0);
    let mut conn = redis::Client::open(server.url(m as u32))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: i64 = redis::cmd("ZREM")
        .arg(members[m].internal_key("queue:q"))
        .arg(&ticket)
        .query(&mut conn)
        .unwrap();
    // Woken (by the other member, then the quorum's grace), while the holder still holds a
    // minute.
    quorum
        .release_after(&held, Duration::from_secs(60))
        .await
        .unwrap();
    until("the woken waiter saved again on that member", || {
        queue_in(&server, m as u32, &members[m], "q").len() == 1
    })
    .await;
    assert_eq!(
        queue_in(&server, m as u32, &members[m], "q"),
        vec![ticket],
        "the woken waiter is still the same waiter, with the same ticket"
    );
}

/// Found in review: a writer's ticket whose waiter is gone from a live process (its `LEAVE`
/// never reached the server) keeps newcomer readers out of a lock that readers hold, for as
/// long as they hold it: refused readers do not wake a writer that could not get in anyway
/// (that would cost every waiting writer one attempt per reader). Once the readers are gone the
/// ticket is woken, its store passes the wake on, and the readers behind it get in.
#[tokio::test]
async fn a_stale_writer_ticket_keeps_readers_out_only_until_the_readers_holding_leave() {
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
    let factory = frozen(&store);
    let reading = factory.create_lock("shared");
    reading.acquire_read().await.unwrap();
    // A writer's ticket of that store for a waiter it no longer has.
    let orphan = format!("{}999999", &ticket[..67]);
    let _: i64 = redis::cmd("ZADD")
        .arg(store.internal_key("queue:shared"))
        .arg(1)
        .arg(&orphan)
        .query(&mut sync_conn(&server))
        .unwrap();
    let reader = factory.create_lock("shared");
    let joining = tokio::spawn(async move { reader.acquire_read().await });
    until("the reader is queued behind the ticket", || {
        queue(&server, &store, "shared").len() == 2
    })
    .await;
    let _ = reading.release().await.unwrap();
    let joined = tokio::time::timeout(Duration::from_secs(20), joining).await;
    assert!(
        matches!(joined, Ok(Ok(Ok(())))),
        "the reader gets in once the gone writer's ticket is passed on: {joined:?}"
    );
    assert!(queue(&server, &store, "shared").is_empty());
}

/// Found in review: two tasks sharing one lock (one token, so one waiter and one ticket
/// number) wait in both modes; the reader's task is cancelled while the writer's still waits.
/// Each had queued a ticket of its own mode (`r…` sorts before `w…` at the same score), and the
/// reader's, left behind, kept its sibling and everybody else out of the free lock. A waiter
/// now has one ticket, of its latest save's mode, and never counts its own as ahead of it.
#[tokio::test]
async fn a_cancelled_sibling_waiting_in_the_other_mode_does_not_stall_the_lock() {
    let server = RedisServer::start();
    let store = store(&server);
    let holder = frozen(&store).create_lock("siblings");
    holder.acquire().await.unwrap();
    let shared = LockFactory::new(store.clone())
        .with_ttl(Some(TTL))
        .create_lock("siblings");
    let reading = shared.clone();
    let reader = tokio::spawn(async move { reading.acquire_read().await });
    until("the reader is queued", || {
        queue(&server, &store, "siblings").len() == 1
    })
    .await;
    let writing = shared.clone();
    let writer = tokio::spawn(async move { writing.acquire().await });
    // One holder, one ticket: the writer's save takes the place of the reader's.
    until("the writer is queued", || {
        queue(&server, &store, "siblings")
            .first()
            .is_some_and(|t| t.starts_with('w'))
    })
    .await;
    assert_eq!(queue(&server, &store, "siblings").len(), 1);
    reader.abort();
    assert!(reader.await.unwrap_err().is_cancelled());
    let _ = holder.release().await.unwrap();
    let wrote = tokio::time::timeout(Duration::from_secs(20), writer).await;
    assert!(
        matches!(wrote, Ok(Ok(Ok(())))),
        "the sibling left waiting gets in once the lock is free: {wrote:?}"
    );
}

/// Found in review: as above with no cancellation at all: a sibling's single
/// `try_acquire_read` while the other waits to write sends the shared waiter's ticket in `r`
/// (a try carries the ticket whenever its holder has a registered waiter), which queues an `r`
/// ticket nobody waits on, ahead of the `w` one (same score). The waiting writer then loops on
/// a free lock, refused by that ticket, waking itself through it.
#[tokio::test]
async fn a_siblings_try_in_the_other_mode_does_not_stall_the_waiting_one() {
    let server = RedisServer::start();
    let store = store(&server);
    let holder = frozen(&store).create_lock("try-sibling");
    holder.acquire().await.unwrap();
    let shared = LockFactory::new(store.clone())
        .with_ttl(Some(TTL))
        .create_lock("try-sibling");
    let writing = shared.clone();
    let writer = tokio::spawn(async move { writing.acquire().await });
    until("the writer is queued", || {
        queue(&server, &store, "try-sibling").len() == 1
    })
    .await;
    assert!(!shared.try_acquire_read().await.unwrap());
    let _ = holder.release().await.unwrap();
    let wrote = tokio::time::timeout(Duration::from_secs(20), writer).await;
    assert!(
        matches!(wrote, Ok(Ok(Ok(())))),
        "the waiting sibling gets in once the lock is free: {wrote:?}"
    );
}

/// Found in review: the queue expired a minute past the lease its newest waiter waited behind,
/// so behind a lock renewed for longer every waiter's place could go. It now lives an hour past
/// it, and each new waiter's refusal sets it again.
#[tokio::test]
async fn the_queue_outlives_a_long_renewed_lease() {
    let server = RedisServer::start();
    let store = store(&server);
    let factory = frozen(&store);
    let holder = factory.create_lock("kept");
    holder.acquire().await.unwrap();
    let first = factory.create_lock("kept");
    let _first = tokio::spawn(async move { first.acquire().await });
    until("queued", || queue(&server, &store, "kept").len() == 1).await;
    let key = store.internal_key("queue:kept");
    let pttl = |server: &RedisServer| -> i64 {
        redis::cmd("PTTL")
            .arg(&key)
            .query(&mut sync_conn(server))
            .unwrap()
    };
    assert!(pttl(&server) > 3_600_000, "an hour past the holder's lease");
    // Time passes (as if the lock had been renewed for long): the queue is about to expire.
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(2_000)
        .query(&mut sync_conn(&server))
        .unwrap();
    let second = factory.create_lock("kept");
    assert!(!second.try_acquire().await.unwrap());
    let _second = tokio::spawn(async move { second.acquire().await });
    until("the second is queued", || {
        queue(&server, &store, "kept").len() == 2
    })
    .await;
    assert!(
        pttl(&server) > 3_600_000,
        "the new waiter's refusal kept the queue alive"
    );
}
