//! RedisStore beyond the conformance suite, against real throwaway servers: the layout on the
//! wire, foreign values, faults (killed, paused, unreachable), renewal and loss, waking without a
//! thundering herd, cancellation, replicas, holder ids. The peers, connections and fencing have
//! files of their own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::{
    ErrorKind, Key, Lock, LockFactory, Lockable as _, LostReason, ManualClock, RedisStore, Release,
    RunOptions, Store,
};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, lock, store};
use crate::support::peer::Peer;

/// `ZRANGE key 0 -1 WITHSCORES`, as (member, score) pairs.
fn zset(server: &RedisServer, key: &str) -> Vec<(String, u64)> {
    let out = server.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"]);
    let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    lines
        .chunks(2)
        .map(|c| (c[0].to_owned(), c[1].parse().unwrap()))
        .collect()
}

fn server_ms(server: &RedisServer) -> u64 {
    let t = server.cli(&["TIME"]);
    let mut parts = t.lines();
    let s: u64 = parts.next().unwrap().parse().unwrap();
    let us: u64 = parts.next().unwrap().parse().unwrap();
    s * 1000 + us / 1000
}

fn evalsha_calls(server: &RedisServer) -> u64 {
    server.command_calls("evalsha")
}

// ---- the layout on the wire --------------------------------------------------------------------

#[tokio::test]
async fn the_lock_is_the_peers_sorted_set_under_prefix_plus_resource() {
    let server = RedisServer::start();
    let store = RedisStore::from_dsn(&format!("{}?prefix=app%3Alocks%3A", server.url(0))).unwrap();
    assert_eq!(store.prefix(), "app:locks:");
    let lock = lock(&store, "invoice:42", Duration::from_secs(2));
    assert!(lock.try_acquire().await.unwrap());
    let token = lock.key().token("redis");
    let members = zset(&server, "app:locks:invoice:42");
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(members.iter().any(|(m, _)| m == "__write__"));
    assert!(members.iter().any(|(m, _)| *m == token));
    assert_eq!(
        members[0].1, members[1].1,
        "the marker has the writer's score"
    );
    let left = members[0].1.saturating_sub(server_ms(&server));
    assert!(
        left > 0 && left <= 2000,
        "score = server now + ttl: {left} ms left"
    );
    let pttl: i64 = server
        .cli(&["PTTL", "app:locks:invoice:42"])
        .parse()
        .unwrap();
    assert!(
        pttl > 0 && pttl <= 2000,
        "the key expires with its last lease: {pttl}"
    );
    assert_eq!(token.len(), 44);

    lock.try_acquire_read().await.unwrap();
    let members = zset(&server, "app:locks:invoice:42");
    assert_eq!(members.len(), 1, "demoted: the marker is gone: {members:?}");
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    assert_eq!(
        server.cli(&["EXISTS", "app:locks:invoice:42"]),
        "0",
        "gone after release"
    );
    // A conflict says when the holder's lease ends, from the sorted set under the prefixed key.
    let other = lock_from(&store, "invoice:42");
    lock.try_acquire().await.unwrap();
    let refused = store.save(other.key(), Some(TTL)).await.unwrap();
    let hint = refused
        .conflict()
        .and_then(|c| c.retry_after)
        .expect("a hint");
    assert!(hint <= TTL && !hint.is_zero(), "{hint:?}");
}

fn lock_from(store: &RedisStore, resource: &str) -> Lock {
    lock(store, resource, TTL)
}

#[tokio::test]
async fn one_round_trip_per_acquire_refresh_and_release() {
    let server = RedisServer::start();
    let store = store(&server);
    let lock = lock(&store, "trips", TTL);
    // Warm up: connect, probe the clock, load each script once (NOSCRIPT, SCRIPT LOAD).
    lock.try_acquire().await.unwrap();
    lock.refresh(None).await.unwrap();
    let _ = lock.release().await.unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    lock.try_acquire().await.unwrap();
    lock.refresh(None).await.unwrap();
    let _ = lock.release().await.unwrap();
    assert_eq!(server.command_calls("evalsha"), 3);
    assert_eq!(server.command_calls("eval"), 0);
    assert_eq!(server.command_calls("script"), 0, "no script loaded again");
}

#[tokio::test]
async fn foreign_values_at_the_key() {
    let server = RedisServer::start();
    let store = store(&server);
    server.cli(&["SET", "someone-else", "their-token"]);
    let lock = lock(&store, "someone-else", TTL);
    assert!(
        !lock.try_acquire().await.unwrap(),
        "a string is someone else's lock"
    );
    assert!(!lock.try_acquire_read().await.unwrap());
    assert!(!lock.is_acquired().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::NotHeld);
    assert_eq!(
        server.cli(&["GET", "someone-else"]),
        "their-token",
        "untouched"
    );
    assert_eq!(store.holders("someone-else").await.unwrap().len(), 1);

    server.cli(&["HSET", "a-hash", "f", "v"]);
    let err = store
        .save(&Key::new("a-hash"), Some(TTL))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Storage);
    assert_eq!(err.resource(), Some("a-hash"));
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let err = lock_from(&store, "a-hash").try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Acquiring);
    assert_eq!(server.cli(&["HGET", "a-hash", "f"]), "v");
}

#[tokio::test]
async fn a_lock_needs_a_ttl_on_redis() {
    let server = RedisServer::start();
    let lock = LockFactory::new(store(&server))
        .create_lock("no-ttl")
        .with_ttl(None);
    let err = lock.try_acquire().await.unwrap_err();
    // Bad input, said as it is (not wrapped as a failure to acquire), before anything is stored.
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("needs a ttl"), "{err}");
    assert_eq!(server.cli(&["EXISTS", "no-ttl"]), "0");
}

// ---- faults ------------------------------------------------------------------------------------

#[tokio::test]
async fn a_killed_server_gives_clear_temporary_errors_and_works_again_after_restart() {
    let mut server = RedisServer::start();
    let store = store(&server);
    let lock = lock(&store, "crash", TTL);
    assert!(lock.try_acquire().await.unwrap());
    server.kill();
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Releasing);
    assert!(err.is_temporary(), "{err:?}");
    let err = lock.refresh(None).await.unwrap_err();
    assert!(err.is_temporary(), "{err:?}");
    server.restart();
    // The server forgot everything (no persistence); the store reconnects.
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = lock_from(&store, "crash");
    loop {
        match again.try_acquire().await {
            Ok(got) => {
                assert!(got);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "never reconnected: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_paused_server_times_out_within_the_socket_timeout() {
    let server = RedisServer::start();
    let store = RedisStore::from_dsn(&format!("{}?socket_timeout=0.5", server.url(0))).unwrap();
    let lock = lock(&store, "pause", TTL);
    assert!(lock.try_acquire().await.unwrap());
    server.pause();
    let started = Instant::now();
    let err = lock_from(&store, "pause").try_acquire().await.unwrap_err();
    let took = started.elapsed();
    server.resume();
    assert!(err.is_temporary(), "{err:?}");
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(cause.contains("did not answer in time"), "{cause}");
    assert!(
        took < Duration::from_secs(5),
        "a bounded wait, not a hang: {took:?}"
    );
}

/// A fresh store's first write probes the server's clock first: that probe, too, gives up at
/// the socket timeout (the connection's own bound is longer, for requests left to land).
#[tokio::test]
async fn a_fresh_stores_first_write_to_a_paused_server_times_out_within_the_socket_timeout() {
    let server = RedisServer::start();
    let store = RedisStore::from_dsn(&format!("{}?socket_timeout=0.5", server.url(0))).unwrap();
    // Connected, but not yet probed.
    let _ = store.holders("warm").await;
    server.pause();
    let started = Instant::now();
    let err = lock(&store, "pause-fresh", TTL)
        .try_acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    server.resume();
    assert!(err.is_temporary(), "{err:?}");
    assert!(
        took < Duration::from_millis(1500),
        "socket_timeout=0.5, but the first write took {took:?}"
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_storage_error_naming_no_secret() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dsn = format!("redis://user:hunter2@127.0.0.1:{port}/0?socket_connect_timeout=1");
    let store = RedisStore::from_dsn(&dsn).unwrap();
    assert_eq!(store.to_string(), format!("redis://127.0.0.1:{port}/0"));
    let started = Instant::now();
    let err = store.save(&Key::new("r"), Some(TTL)).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(err.kind(), ErrorKind::Storage);
    assert!(err.is_temporary());
    let shown = format!("{err} {err:?} {store:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

// ---- keep-alive, fencing, waking -----------------------------------------------------------------

#[tokio::test]
async fn keep_alive_holds_a_lock_past_several_ttls_and_signals_its_loss() {
    let server = RedisServer::start();
    let store = store(&server);
    let ttl = Duration::from_millis(300);
    let held = lock(&store, "kept", ttl);
    assert!(held.try_acquire().await.unwrap());
    let alive = held.keep_alive().unwrap();
    tokio::time::sleep(ttl * 5).await;
    assert!(held.is_acquired().await.unwrap(), "kept past five ttls");
    assert!(!lock(&store, "kept", ttl).try_acquire().await.unwrap());
    assert!(!alive.is_lost());
    server.cli(&["DEL", "kept"]); // behind its back
    let lost = tokio::time::timeout(Duration::from_secs(5), alive.lost())
        .await
        .expect("the loss is signalled within a refresh period");
    assert_eq!(lost.reason, LostReason::Removed, "deleted, not taken over");
    assert!(lost.to_string().contains("'kept' was lost"), "{lost}");
    assert!(!held.is_acquired().await.unwrap());
}

/// Another holder tries every 100 ms while `run` holds `resource` with `ttl`; whether any got it.
fn contend(store: &RedisStore, resource: &str, ttl: Duration) -> tokio::task::JoinHandle<bool> {
    let other = lock(store, resource, ttl);
    tokio::spawn(async move {
        for _ in 0..25 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if other.try_acquire().await.unwrap() {
                return true;
            }
        }
        false
    })
}

#[tokio::test]
async fn run_and_scoped_keep_a_short_lived_lock_past_several_ttls() {
    // Observed before renewal was the default: ttl 1 s, a 3 s body, another holder got the lock
    // at 1.5 s and `run` returned Ok("body done").
    let server = RedisServer::start();
    let store = store(&server);
    let ttl = Duration::from_secs(1);
    let factory = LockFactory::new(store.clone());
    let others = contend(&store, "report", ttl);
    let out = factory
        .run("report", RunOptions::new().ttl(ttl), || async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok::<_, xtr_lock::Error>("body done")
        })
        .await;
    assert_eq!(out.unwrap(), "body done");
    assert!(
        !others.await.unwrap(),
        "nobody else got the lock while the body ran"
    );

    let scoped = lock(&store, "scoped", ttl);
    let others = contend(&store, "scoped", ttl);
    let out = scoped
        .scoped(async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok::<_, xtr_lock::Error>(3)
        })
        .await;
    assert_eq!(out.unwrap(), 3);
    assert!(!others.await.unwrap());
}

#[tokio::test]
async fn a_key_deleted_mid_body_stops_run_and_it_does_not_return_success() {
    let server = RedisServer::start();
    let store = store(&server);
    let ttl = Duration::from_secs(1);
    let factory = LockFactory::new(store.clone());
    let started = Instant::now();
    let out = factory
        .run("report", RunOptions::new().ttl(ttl), || async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            server.cli(&["DEL", "report"]); // behind its back
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok::<_, xtr_lock::Error>("body done")
        })
        .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err:?}");
    assert_eq!(err.lost_reason(), Some(LostReason::Removed));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopped at the next refresh, not at the end of the body"
    );
    // Deleted after the body's last await: the release finds nothing, still not success.
    let out = factory
        .run("report", RunOptions::new().ttl(ttl), || async {
            server.cli(&["DEL", "report"]);
            Ok::<_, xtr_lock::Error>("body done")
        })
        .await;
    assert_eq!(out.unwrap_err().kind(), ErrorKind::Lost);
    // Taken over meanwhile: the new holder is left alone.
    let thief = lock(&store, "report", TTL);
    let out = factory
        .run("report", RunOptions::new().ttl(ttl), || async {
            server.cli(&["DEL", "report"]);
            assert!(thief.try_acquire().await.unwrap());
            Ok::<_, xtr_lock::Error>("body done")
        })
        .await;
    assert_eq!(out.unwrap_err().kind(), ErrorKind::Lost);
    assert!(
        thief.is_acquired().await.unwrap(),
        "the new holder keeps it"
    );
}

#[tokio::test]
async fn keep_alive_stops_on_release_and_on_drop() {
    let server = RedisServer::start();
    let store = store(&server);
    let ttl = Duration::from_millis(300);
    let held = lock(&store, "stop", ttl);
    held.try_acquire().await.unwrap();
    let alive = held.keep_alive().unwrap();
    drop(alive);
    tokio::time::sleep(ttl * 2).await;
    assert!(
        !held.is_acquired().await.unwrap(),
        "dropped: no more refreshes, it expired"
    );
    held.try_acquire().await.unwrap();
    let alive = held.keep_alive().unwrap();
    let _ = held.release().await.unwrap();
    tokio::time::sleep(ttl).await;
    assert!(!alive.is_lost(), "a release is not a loss");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), alive.lost())
            .await
            .is_err(),
        "lost() stays pending after a release"
    );
    assert!(!held.is_acquired().await.unwrap(), "and nothing re-took it");
}

#[tokio::test]
async fn a_release_wakes_one_waiter_not_all_of_them() {
    let server = RedisServer::start();
    let store = store(&server);
    // A frozen clock: no poll and no retry sleep ever ends, so only notifications wake.
    let factory = LockFactory::new(store.clone())
        .with_clock(Arc::new(ManualClock::frozen()))
        .with_ttl(Some(TTL));
    let holder = factory.create_lock("herd");
    holder.acquire().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..100 {
        let lock = factory.create_lock("herd");
        let tx = tx.clone();
        waiters.push(tokio::spawn(async move {
            lock.acquire().await.unwrap();
            tx.send((i, lock)).unwrap();
        }));
    }
    // Every waiter has made its two attempts (the try, then the one that queued it) and only
    // waits: the clock never moves.
    let deadline = Instant::now() + Duration::from_secs(10);
    while evalsha_calls(&server) < 201 {
        assert!(Instant::now() < deadline, "the waiters never all tried");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.cli(&["CONFIG", "RESETSTAT"]);
    let _ = holder.release().await.unwrap();
    let (_, first) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let evals = evalsha_calls(&server);
    assert_eq!(
        evals, 1,
        "one release costs the release alone (it granted the lock to the first waiter), not \
         ~100 retries"
    );
    assert!(rx.try_recv().is_err(), "exactly one waiter got the lock");
    // The rest still get their turn, one release at a time.
    let _ = first.release().await.unwrap();
    for _ in 0..99 {
        let (_, next) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the next waiter is woken")
            .unwrap();
        let _ = next.release().await.unwrap();
    }
    for w in waiters {
        w.await.unwrap();
    }
}

#[tokio::test]
async fn cancellation_at_random_points_leaves_no_member_behind() {
    let server = RedisServer::start();
    let store = store(&server);
    let holder = lock(&store, "cancel", TTL);
    for i in 0..60u64 {
        let held = i % 3 == 0;
        if held {
            holder.acquire().await.unwrap();
        }
        let waiter = lock(&store, "cancel", TTL);
        let budget = Duration::from_micros((i * 97) % 1500);
        let done = if i % 2 == 0 {
            tokio::time::timeout(budget, waiter.acquire()).await
        } else {
            tokio::time::timeout(budget, waiter.acquire_read()).await
        };
        let completed = matches!(done, Ok(Ok(())));
        // The holder's next operation runs after any clean-up.
        let still = waiter.is_acquired().await.unwrap();
        assert_eq!(still, completed, "round {i}");
        if completed {
            let _ = waiter.release().await.unwrap();
        }
        if held {
            let _ = holder.release().await.unwrap();
        }
        // A release may have granted the lock to the cancelled waiter's ticket before its
        // leaving reached the server: its store takes the grant back, in the background.
        let token = waiter.key().token("redis");
        let deadline = Instant::now() + Duration::from_secs(5);
        while zset(&server, "cancel").iter().any(|(m, _)| *m == token) {
            assert!(
                Instant::now() < deadline,
                "round {i}: the cancelled waiter's member is gone"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert_eq!(
        server.cli(&["EXISTS", "cancel"]),
        "0",
        "nothing left behind"
    );
}

#[tokio::test]
async fn a_waiter_takes_a_crashed_holders_lock_when_it_expires() {
    let server = RedisServer::start();
    let store = store(&server);
    let crashed = lock(&store, "expiry", Duration::from_millis(500));
    crashed.try_acquire().await.unwrap();
    drop(crashed); // never released
    let waiter = lock(&store, "expiry", TTL);
    let started = Instant::now();
    waiter.acquire().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(waiter.is_acquired().await.unwrap());
}

#[tokio::test]
async fn is_acquired_writes_nothing_and_works_on_a_replica() {
    let primary = RedisServer::start();
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    let on_primary = store(&primary);
    let held = lock(&on_primary, "replicated", TTL);
    held.try_acquire().await.unwrap();
    // Wait for the replica to have the key.
    let deadline = Instant::now() + Duration::from_secs(10);
    while replica.cli(&["EXISTS", "replicated"]) != "1" {
        assert!(Instant::now() < deadline, "replication never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let on_replica = store(&replica);
    let copy = Key::from_json(&held.key().to_json().unwrap()).unwrap();
    assert!(
        on_replica.exists(&copy).await.unwrap().is_held(),
        "read-only: runs on a replica"
    );
    assert!(
        !on_replica
            .exists(&Key::new("replicated"))
            .await
            .unwrap()
            .is_held()
    );
    // A write is refused there, which is what makes the replica a proof.
    assert!(
        on_replica
            .save(&Key::new("other"), Some(TTL))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn holders_carry_an_id_that_matches_the_key_and_hides_the_token() {
    let server = RedisServer::start();
    let store = store(&server);
    let writer = lock(&store, "r", TTL);
    assert!(writer.try_acquire().await.unwrap());
    let hs = store.holders("r").await.unwrap();
    assert_eq!(hs.len(), 1);
    let id = hs[0].id.clone().expect("an id");
    assert_eq!(Some(id.clone()), writer.key().holder_id("redis"));
    assert_eq!(id.len(), 12);
    let token = writer.key().token("redis");
    assert!(!token.contains(&id) && !format!("{hs:?}").contains(&token));
    let _ = writer.release().await.unwrap();
    // A Python peer's holder gets an id too: it is the token in the set that is digested.
    let mut py = Peer::python("redis", &server.url(0));
    assert_eq!(py.call_ttl("try_write", "r", Some(30.0)), true);
    let hs = store.holders("r").await.unwrap();
    assert_eq!(hs.len(), 1);
    assert!(hs[0].id.is_some() && hs[0].id != Some(id));
    py.call("release", "r");
}
