//! Direct hand-off on Redis: a release grants the lock to the writer at the head of the queue,
//! which holds without a save of its own; a grant nobody takes in is given back at once, runs
//! out at its ttl if its waiter stopped, and never makes a holder believe in a lease the
//! server does not keep. Checked by what the server holds, never by timing.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use redis::Commands as _;
use xtr_lock::store::Saved;
use xtr_lock::{Key, LockFactory, Lockable as _, ManualClock, RedisStore, Store as _};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, frozen, queue, store, sync_conn, until};

/// The record the store keeps for `token`'s holder of `resource`.
fn record(server: &RedisServer, store: &RedisStore, resource: &str, token: &str) -> String {
    sync_conn(server)
        .get::<_, Option<String>>(store.internal_key(&format!("rec:{resource}:{token}")))
        .unwrap()
        .unwrap_or_default()
}

/// Writes what a release's grant of `resource` to `token` writes (the entry with the writer's
/// marker for 30 s, and the record marked granted with `fence`); returns the server's clock in
/// µs it is dated from.
fn plant_grant(
    server: &RedisServer,
    store: &RedisStore,
    resource: &str,
    token: &str,
    fence: u64,
) -> u64 {
    let mut conn = sync_conn(server);
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let at_us = secs * 1_000_000 + micros;
    let score = at_us / 1000 + 30_000;
    let _: () = redis::pipe()
        .zadd(resource, token, score)
        .zadd(resource, "__write__", score)
        .set(
            store.internal_key(&format!("rec:{resource}:{token}")),
            format!(
                "{{\"v\":1,\"at_ms\":{},\"fence\":{fence},\"g\":1}}",
                at_us / 1000
            ),
        )
        .query(&mut conn)
        .unwrap();
    at_us
}

/// A waiter registered through the store itself (no `Lock`), its refused save queueing it.
async fn registered(
    store: &RedisStore,
    resource: &str,
    ttl: Duration,
) -> (Key, xtr_lock::store::Watcher) {
    let key = Key::new(resource);
    // As a `Lock` does: an attempt, the registration, the attempt that queues it.
    assert!(matches!(
        store.save(&key, Some(ttl)).await.unwrap(),
        Saved::Conflict(_)
    ));
    let watcher = store.watch(&key, SystemTime::now()).await.unwrap().unwrap();
    assert!(matches!(
        store.save(&key, Some(ttl)).await.unwrap(),
        Saved::Conflict(_)
    ));
    (key, watcher)
}

#[tokio::test]
async fn a_release_grants_the_head_the_lock_with_a_lease_no_longer_than_the_servers() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let mut fences = Vec::new();
    let mut holder = frozen(&a).create_lock("handoff");
    let _ = &b;
    holder.acquire().await.unwrap();
    fences.push(holder.fencing_token().unwrap());
    // Twenty hand-offs between two "processes": each waiter granted the lock by the release.
    for i in 0..20 {
        let next_store = if i % 2 == 0 { &b } else { &a };
        let next = LockFactory::new(next_store.clone())
            .with_ttl(Some(TTL))
            .create_lock("handoff");
        let _ = next.key().token("redis");
        let waiting = tokio::spawn(async move {
            next.acquire().await.unwrap();
            next
        });
        until("the waiter is queued", || {
            queue(&server, next_store, "handoff").len() == 1
        })
        .await;
        let _ = holder.release().await.unwrap();
        holder = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the release handed the lock over")
            .unwrap();
        let token = holder.key().token("redis");
        let rec = record(&server, next_store, "handoff", &token);
        assert!(rec.contains("\"g\":1"), "granted, not saved: {rec}");
        fences.push(holder.fencing_token().unwrap());
        // The holder's lease ends no later than the server's.
        let pttl: i64 = sync_conn(&server).pttl("handoff").unwrap();
        let believed = holder.remaining_lifetime().unwrap();
        assert!(
            believed <= Duration::from_millis(u64::try_from(pttl).unwrap()),
            "believed {believed:?}, server {pttl} ms"
        );
        assert!(believed > TTL / 2, "{believed:?}");
        // Its first renewal confirms it as any lease.
        holder.refresh(None).await.unwrap();
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    let _ = holder.release().await.unwrap();
}

#[tokio::test]
async fn a_grant_its_waiter_never_takes_in_is_given_back_at_once() {
    let server = RedisServer::start();
    let (a, b, c) = (store(&server), store(&server), store(&server));
    let holder = frozen(&a).create_lock("cancel");
    holder.acquire().await.unwrap();
    let (granted, mut watcher) = registered(&b, "cancel", TTL).await;
    // A third waiter behind it, in another process.
    let third = LockFactory::new(c.clone())
        .with_ttl(Some(TTL))
        .create_lock("cancel");
    let waiting = tokio::spawn(async move {
        third.acquire().await.unwrap();
        third
    });
    until("both are queued", || {
        queue(&server, &c, "cancel").len() == 2
    })
    .await;
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut watcher)
        .await
        .expect("the head is woken");
    let token = granted.token("redis");
    let members: Vec<String> = sync_conn(&server).zrange("cancel", 0, -1).unwrap();
    assert!(members.contains(&token), "granted to the head: {members:?}");
    // Its waiter gives up without taking the grant in (a timeout, a dropped future).
    drop(watcher);
    let third = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the grant was given back and passed on, not left to run out")
        .unwrap();
    assert!(third.is_acquired().await.unwrap());
    let members: Vec<String> = sync_conn(&server).zrange("cancel", 0, -1).unwrap();
    assert!(!members.contains(&token), "{members:?}");
    assert_eq!(record(&server, &b, "cancel", &token), "");
}

#[tokio::test]
async fn a_granted_waiter_that_stops_keeps_the_lock_no_longer_than_its_ttl() {
    let server = RedisServer::start();
    let (a, b, c) = (store(&server), store(&server), store(&server));
    let short = Duration::from_secs(2);
    let holder = frozen(&a).create_lock("stopped");
    holder.acquire().await.unwrap();
    // The head is granted the lock and never runs again (its process stopped): its watcher
    // lives, unpolled.
    let (_granted, _watcher) = registered(&b, "stopped", short).await;
    let next = LockFactory::new(c.clone())
        .with_ttl(Some(TTL))
        .create_lock("stopped");
    let _ = holder.release().await.unwrap();
    let started = std::time::Instant::now();
    assert!(
        next.acquire_timeout(Duration::from_secs(10)).await.unwrap(),
        "the grant ran out"
    );
    // Not before the grant's ttl (exclusion), and not long after it.
    let waited = started.elapsed();
    assert!(waited >= short - Duration::from_millis(50), "{waited:?}");
}

#[tokio::test]
async fn a_grant_for_a_waiter_its_store_no_longer_has_is_taken_back() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    // A waiter of b queued somewhere, so b's wake channel is subscribed and its id known.
    let held = frozen(&a).create_lock("elsewhere");
    held.acquire().await.unwrap();
    let (_waiting, _watcher) = registered(&b, "elsewhere", TTL).await;
    let ticket = queue(&server, &b, "elsewhere").remove(0);
    let id = &ticket[45..67];
    let wake = |payload: String| {
        let _: i64 = sync_conn(&server)
            .publish(format!("__xtr_lock__:wake:{id}"), payload)
            .unwrap();
    };
    // A holder that re-saved its grant (its record no longer says granted) keeps it, whatever
    // wake names its token.
    let kept = Key::new("kept");
    assert!(matches!(
        a.save(&kept, Some(TTL)).await.unwrap(),
        Saved::Acquired(_)
    ));
    let kept_token = kept.token("redis");
    let score: f64 = sync_conn(&server).zscore("kept", &kept_token).unwrap();
    let at_us = (score as u64 - 30_000) * 1000;
    wake(format!("{id}999998:30000;7;{at_us};{kept_token} kept"));
    // A grant as a release writes it, for a waiter number b never had: taken back.
    let token = format!("{}eHRyLXdha2U=", "Q".repeat(32));
    let at_us = plant_grant(&server, &b, "orphan", &token, 7);
    wake(format!("{id}999999:30000;7;{at_us};{token} orphan"));
    until("the grant is taken back", || {
        sync_conn(&server).zcard::<_, i64>("orphan").unwrap() == 0
    })
    .await;
    // The wakes are read in order, and the holder's next call on b waits for b's clean-ups of
    // it: the first wake's has run.
    assert!(
        b.exists(&kept).await.unwrap().is_held(),
        "a held lock was taken back"
    );
}

#[tokio::test]
async fn a_waiter_whose_grant_is_too_old_to_believe_saves_it_and_keeps_its_token() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let holder = frozen(&a).create_lock("late");
    holder.acquire().await.unwrap();
    let clock = Arc::new(ManualClock::new());
    let key = Key::with_clock("late", clock.clone());
    assert!(matches!(
        b.save(&key, Some(TTL)).await.unwrap(),
        Saved::Conflict(_)
    ));
    let mut watcher = b.watch(&key, SystemTime::now()).await.unwrap().unwrap();
    assert!(matches!(
        b.save(&key, Some(TTL)).await.unwrap(),
        Saved::Conflict(_)
    ));
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut watcher)
        .await
        .expect("woken");
    let token = key.token("redis");
    let granted = record(&server, &b, "late", &token);
    assert!(granted.contains("\"g\":1"), "{granted}");
    // More than half the ttl passed on the waiter's clock since its refusal: the grant alone
    // would leave it too little; its save re-saves it on the server instead.
    clock.advance(TTL * 3 / 4);
    key.reset_lifetime();
    let Saved::Acquired(acquired) = b.save(&key, Some(TTL)).await.unwrap() else {
        panic!("the granted waiter is refused");
    };
    let fence: u64 = granted
        .split("\"fence\":")
        .nth(1)
        .and_then(|f| f.split([',', '}']).next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(acquired.fencing_token, Some(fence), "the grant's token");
    assert!(!record(&server, &b, "late", &token).contains("\"g\""));
    assert!(key.remaining_lifetime().unwrap() > TTL / 2);
    // Its leaving runs in the background; the holder's next call waits for it.
    drop(watcher);
    assert!(
        b.exists(&key).await.unwrap().is_held(),
        "the re-saved grant was taken back"
    );
}

/// Found in review: metadata set while the waiter waits (after its first ticket asked for
/// grants) was lost: the grant was taken in locally, and the record the release wrote carries
/// none. The save now goes to the server.
#[tokio::test]
async fn meta_set_while_waiting_is_stored_by_the_save_that_takes_the_grant_in() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let holder = frozen(&a).create_lock("metalate");
    holder.acquire().await.unwrap();
    let (key, mut watcher) = registered(&b, "metalate", TTL).await;
    key.set_meta(Some(b"host=w".to_vec())).unwrap();
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut watcher)
        .await
        .expect("woken");
    assert!(matches!(
        b.save(&key, Some(TTL)).await.unwrap(),
        Saved::Acquired(_)
    ));
    let rec = record(&server, &b, "metalate", &key.token("redis"));
    assert!(
        rec.contains("\"meta\""),
        "the holder's metadata was not stored: {rec}"
    );
}

/// Found in review: the grant's ttl is the first ticket's; a later save asking a shorter ttl
/// took in a grant for the longer one (the server kept the lock longer than the holder asked).
#[tokio::test]
async fn a_grant_is_for_the_ttl_the_save_asks() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let holder = frozen(&a).create_lock("ttllate");
    holder.acquire().await.unwrap();
    let (key, mut watcher) = registered(&b, "ttllate", TTL).await;
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut watcher)
        .await
        .expect("woken");
    let short = Duration::from_secs(2);
    assert!(matches!(
        b.save(&key, Some(short)).await.unwrap(),
        Saved::Acquired(_)
    ));
    let pttl: i64 = sync_conn(&server).pttl("ttllate").unwrap();
    assert!(
        pttl <= 2_000,
        "asked for {short:?}, the server keeps it {pttl} ms"
    );
}

/// Found in review: a grant offered to a waiter outlived the hold it gave. The holder's save
/// while the wake channel was down (no ticket) re-saved the grant on the server and was
/// admitted, but the offer was not spent; after that hold was released and another process
/// held, the waiter's next ticketed save took the stale grant in locally: two holders.
#[tokio::test]
async fn a_stale_offered_grant_is_never_taken_in_after_its_hold_ended() {
    let server = RedisServer::start();
    let (a, b, c) = (store(&server), store(&server), store(&server));
    let holder = frozen(&a).create_lock("stale");
    holder.acquire().await.unwrap();
    // Two watchers of one holder (sibling tasks of one lock): the waiter stays registered.
    let (key, mut first) = registered(&b, "stale", TTL).await;
    let _second = b.watch(&key, SystemTime::now()).await.unwrap().unwrap();
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut first)
        .await
        .expect("woken: the grant is offered");
    drop(first);
    // The subscriber connection drops (a pub/sub client killed, an output-buffer limit).
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut sync_conn(&server))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A save without a ticket (the channel is down): the server re-saves the grant.
    let Saved::Acquired(held) = b.save(&key, Some(TTL)).await.unwrap() else {
        panic!("the granted holder is refused");
    };
    assert!(held.fencing_token.is_some());
    // It releases; another process takes the lock.
    assert!(b.delete(&key).await.unwrap());
    let other = Key::new("stale");
    assert!(matches!(
        c.save(&other, Some(TTL)).await.unwrap(),
        Saved::Acquired(_)
    ));
    // The waiter (still registered) waits again: its watch resubscribes, its save has a ticket.
    let _third = b.watch(&key, SystemTime::now()).await.unwrap().unwrap();
    key.reset_lifetime();
    let again = b.save(&key, Some(TTL)).await.unwrap();
    assert!(
        !matches!(again, Saved::Acquired(_)),
        "two holders: the waiter took in a spent grant while another process holds: {again:?}"
    );
}

/// Found in review: a forged grant wake with a huge ttl panicked the subscriber's reader task
/// (u64 overflow in `Grant::score`), after which the store believed it was subscribed and its
/// waiters were never woken.
#[tokio::test]
async fn an_odd_grant_wake_does_not_kill_the_reader() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let held = frozen(&a).create_lock("odd");
    held.acquire().await.unwrap();
    let (_waiting, mut watcher) = registered(&b, "odd", TTL).await;
    let ticket = queue(&server, &b, "odd").remove(0);
    let id = &ticket[45..67];
    let token = format!("{}eHRyLXdha2U=", "Q".repeat(32));
    let wake = |payload: String| {
        let _: i64 = sync_conn(&server)
            .publish(format!("__xtr_lock__:wake:{id}"), payload)
            .unwrap();
    };
    wake(format!(
        "{id}999999:18446744073709551615;7;18446744073709551615;{token} odd"
    ));
    // The reader lives on: the next wake (a grant for a waiter b never had) is read and taken
    // back.
    let at_us = plant_grant(&server, &b, "orphan", &token, 7);
    wake(format!("{id}999998:30000;7;{at_us};{token} orphan"));
    until("the reader reads the wake after the odd one", || {
        sync_conn(&server).zcard::<_, i64>("orphan").unwrap() == 0
    })
    .await;
    let _ = held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), &mut watcher)
        .await
        .expect("the waiter is woken by the release after an odd wake");
}

/// A waiter that gives up after a release granted it the lock with a wake it never got (its
/// subscriber connection dropped): its leaving finds its ticket gone and the grant untaken, and
/// takes the grant back, rather than leaving the lock held by nobody until the grant's ttl.
#[tokio::test]
async fn a_waiter_that_leaves_without_its_grants_wake_takes_the_grant_back() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let held = frozen(&a).create_lock("lostwake");
    held.acquire().await.unwrap();
    let (key, watcher) = registered(&b, "lostwake", TTL).await;
    let ticket = queue(&server, &b, "lostwake").remove(0);
    assert!(
        ticket.ends_with(&format!(":{}", TTL.as_millis())),
        "{ticket}"
    );
    // What a release's grant writes, with its wake lost: the ticket out, the token in.
    let token = key.token("redis");
    let mut conn = sync_conn(&server);
    let _: i64 = conn.del("lostwake").unwrap();
    let _: i64 = conn
        .zrem(b.internal_key("queue:lostwake"), &ticket)
        .unwrap();
    plant_grant(&server, &b, "lostwake", &token, 9);
    drop(watcher);
    until("the untaken grant is taken back", || {
        sync_conn(&server).zcard::<_, i64>("lostwake").unwrap() == 0
    })
    .await;
    assert_eq!(record(&server, &b, "lostwake", &token), "");
}

/// Found rereading the change: a save that may not take a grant in (metadata set since the
/// ticket) still took the offer out of the waiter before sending its re-save; when that save
/// failed (here the server refuses writes: out of memory) and the waiter gave up, its leaving
/// no longer counted the grant as untaken, and the lock stayed held by nobody until the grant's
/// ttl. The offer now stays until a save really spends it.
#[tokio::test]
async fn a_grant_whose_save_failed_is_taken_back_when_its_waiter_gives_up() {
    let server = RedisServer::start();
    let (a, b) = (store(&server), store(&server));
    let holder = frozen(&a).create_lock("failed");
    holder.acquire().await.unwrap();
    let (key, mut watcher) = registered(&b, "failed", TTL).await;
    key.set_meta(Some(b"late".to_vec())).unwrap();
    let _ = holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), &mut watcher)
        .await
        .expect("woken: the grant is offered");
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let saved = b.save(&key, Some(TTL)).await;
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(saved.is_err(), "the re-save was refused: {saved:?}");
    assert!(
        record(&server, &b, "failed", &key.token("redis")).contains("\"g\":1"),
        "the grant is still untaken on the server"
    );
    drop(watcher);
    until("the grant is taken back", || {
        sync_conn(&server).zcard::<_, i64>("failed").unwrap() == 0
    })
    .await;
}
