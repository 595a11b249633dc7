//! The pub/sub store on its own: DSNs, names, what a dropped future leaves on the server, and a
//! half-open connection found by the health check.

use std::time::{Duration, Instant};

use xtr_lock::{ErrorKind, LockFactory, Lockable as _, RedisPubSubStore, Store, StoreFactory};
use xtr_lock_testkit::redis::RedisServer;

const SOON: Duration = Duration::from_secs(10);

fn numsub(server: &RedisServer, channel: &str) -> String {
    server
        .cli(&["PUBSUB", "NUMSUB", channel])
        .lines()
        .nth(1)
        .unwrap_or("?")
        .to_owned()
}

/// Waits until nothing of ours is left on the server: no subscriber on `channel`, no holder
/// connection named for it.
async fn nothing_left(server: &RedisServer, channel: &str) {
    let deadline = Instant::now() + SOON;
    loop {
        let names = server.cli(&["CLIENT", "LIST"]);
        if numsub(server, channel) == "0" && !names.contains(&format!("name={channel}-lock-")) {
            return;
        }
        assert!(Instant::now() < deadline, "left behind: {names}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn dsns_build_the_store_and_say_where_locks_live() {
    let server = RedisServer::start();
    let dsn = format!(
        "redis+pubsub://:secret@127.0.0.1:{}/3?prefix=app:&unavailable_timeout=0.5",
        server.port()
    );
    let err =
        StoreFactory::create_store(&dsn.replace("/3?", "/3?unavailable_timeout=x&")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(!err.to_string().contains("secret"), "{err}");
    let store = StoreFactory::create_store(&dsn.replace(":secret@", "")).unwrap();
    assert_eq!(
        store.to_string(),
        format!("redis+pubsub://127.0.0.1:{}/3", server.port())
    );
    // Channels ignore database numbers: the same server and prefix are the same locks.
    let other_db = StoreFactory::create_store(&format!(
        "redis+pubsub://127.0.0.1:{}/5?prefix=app:",
        server.port()
    ))
    .unwrap();
    assert_eq!(store.locks_in(), other_db.locks_in());
    assert_eq!(
        store.location("job").unwrap(),
        format!(
            "channel \"app:job\" on redis+pubsub://127.0.0.1:{}/3",
            server.port()
        )
    );
    let factory = LockFactory::new(store.clone());
    let lock = factory.create_lock("job");
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(numsub(&server, "app:job"), "1");
    assert!(
        !LockFactory::new(other_db)
            .create_lock("job")
            .try_acquire()
            .await
            .unwrap(),
        "another database, the same lock"
    );
    let _ = lock.release().await.unwrap();
}

#[tokio::test]
async fn names_redis_cannot_carry_are_refused_up_front_in_one_line() {
    let server = RedisServer::start();
    let store =
        RedisPubSubStore::from_dsn(&format!("redis+pubsub://127.0.0.1:{}", server.port())).unwrap();
    for name in ["has space", "ünï", "tab\there", ""] {
        let lock = LockFactory::new(store.clone()).create_lock(name);
        let err = lock.try_acquire().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{name:?}: {err}");
        let text = err.to_string();
        assert!(text.contains("channel name is invalid"), "{text}");
        assert!(!text.contains('\n'), "{text}");
        assert!(!lock.is_acquired().await.unwrap());
    }
    assert_eq!(
        server.cli(&["PUBSUB", "CHANNELS"]),
        "",
        "nothing subscribed"
    );
}

/// Acquires dropped at every stage (subscribing, counting, probing, confirming, waiting
/// elected behind a reader) leave no subscription and no named connection behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_leave_nothing_on_the_server() {
    let server = RedisServer::start();
    let store =
        RedisPubSubStore::from_dsn(&format!("redis+pubsub://127.0.0.1:{}", server.port())).unwrap();
    let factory = LockFactory::new(store.clone());
    let channel = "dropped";
    // Free: dropped at random points of the fast path.
    for i in 0..60u64 {
        let lock = factory.create_lock(channel);
        let budget = Duration::from_micros(i * 50);
        if let Ok(Ok(true)) = tokio::time::timeout(budget, lock.try_acquire()).await {
            let _ = lock.release().await.unwrap();
        }
    }
    nothing_left(&server, channel).await;
    // Held by a reader: a writer elected behind it, then dropped.
    let reader = factory.create_lock(channel);
    assert!(reader.try_acquire_read().await.unwrap());
    for i in 0..20u64 {
        let writer = factory.create_lock(channel);
        let budget = Duration::from_millis(i * 15);
        assert!(
            tokio::time::timeout(budget, writer.acquire())
                .await
                .is_err()
        );
        assert!(!writer.is_acquired().await.unwrap());
    }
    let _ = reader.release().await.unwrap();
    nothing_left(&server, channel).await;
}

/// A server that stops answering (paused) is found by the self-checks (and the health check):
/// the holder is told its lock is lost, since nothing says the server still counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_is_a_lost_lock_found_by_the_checks() {
    let server = RedisServer::start();
    let store = RedisPubSubStore::from_dsn(&format!(
        "redis+pubsub://127.0.0.1:{}?health_check_interval=0.2&socket_timeout=0.3",
        server.port()
    ))
    .unwrap();
    let lock = LockFactory::new(store.clone()).create_lock("half-open");
    assert!(lock.try_acquire().await.unwrap());
    let keep_alive = lock.keep_alive().unwrap();
    server.pause();
    let lost = tokio::time::timeout(SOON, keep_alive.lost())
        .await
        .expect("told");
    server.resume();
    assert!(lost.to_string().contains("connection"), "{lost}");
    assert!(!lock.is_acquired().await.unwrap());
    nothing_left(&server, "half-open").await;
}

/// The wire of an uncontended exclusive acquire and release, as `MONITOR` shows it: the name
/// before the subscription (to the lock channel and the holder's own self-check channel, in
/// one command), the count after it (on the same connection, so it counts us), the
/// confirm count with the fencing token, and on release the unsubscribe before the notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_on_the_wire() {
    use std::io::{BufRead as _, BufReader};
    let server = RedisServer::start();
    let store =
        RedisPubSubStore::from_dsn(&format!("redis+pubsub://127.0.0.1:{}", server.port())).unwrap();
    let lock = LockFactory::new(store.clone()).create_lock("wire");
    // Connections warm, so only the lock's own commands follow.
    assert!(lock.try_acquire().await.unwrap());
    let _ = lock.release().await.unwrap();
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "MONITOR"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = monitor.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    assert_eq!(rx.recv_timeout(SOON).unwrap(), "OK");
    assert!(lock.try_acquire().await.unwrap());
    let _ = lock.release().await.unwrap();
    server.cli(&["ECHO", "end"]);
    let mut seen = Vec::new();
    while let Ok(line) = rx.recv_timeout(SOON) {
        if line.contains("\"ECHO\" \"end\"") {
            break;
        }
        // `<time> [<db> <addr>] "CMD" "args"`: the command and the client address.
        let (addr, cmd) = line.split_once("] ").unwrap();
        let addr = addr.rsplit(' ').next().unwrap().to_owned();
        // The next spare connection opening meanwhile (its handshake) is not the lock's.
        if cmd.starts_with("\"HELLO\"") || cmd.starts_with("\"CLIENT\" \"SETINFO\"") {
            continue;
        }
        // Nor are the holder's self-checks, on their own clock.
        if cmd.starts_with("\"PUBLISH\" \"wire xtr-lock-self-check ") {
            continue;
        }
        seen.push((addr, cmd.to_owned()));
    }
    monitor.kill().unwrap();
    let _ = monitor.wait();
    let commands: Vec<&str> = seen.iter().map(|(_, c)| c.as_str()).collect();
    let name = commands[0];
    assert!(
        name.starts_with("\"CLIENT\" \"SETNAME\" \"wire-lock-"),
        "{commands:#?}"
    );
    let id = name.rsplit('-').next().unwrap().trim_end_matches('"');
    let subscribe = format!("\"SUBSCRIBE\" \"wire\" \"wire xtr-lock-self-check {id}\"");
    // The fencing draw: one script (INCR, and a seed when it made the counter), then its INCR.
    let draw = commands
        .iter()
        .find(|c| c.starts_with("\"EVAL\"") && c.ends_with("\"1\" \"wire-fence\""))
        .copied()
        .unwrap_or("");
    assert_eq!(
        &commands[1..],
        [
            subscribe.as_str(),
            "\"PUBSUB\" \"NUMSUB\" \"wire\"",
            "\"PUBSUB\" \"NUMSUB\" \"wire\"",
            draw,
            "\"INCR\" \"wire-fence\"",
            "\"UNSUBSCRIBE\" \"wire\"",
            "\"PUBLISH\" \"wire xtr-lock-released\" \"\"",
        ],
        "{commands:#?}"
    );
    // Name, subscription and first count on the holder's connection; so are its release and
    // notice.
    let holder = &seen[0].0;
    for i in [1, 2, 6, 7] {
        assert_eq!(&seen[i].0, holder, "{seen:#?}");
    }
}

/// A server that is not there is reported with the client's cause, not a redacted placeholder.
#[tokio::test]
async fn an_unreachable_server_is_reported_with_its_cause() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store =
        StoreFactory::create_store(&format!("redis+pubsub://:secret@127.0.0.1:{port}/0")).unwrap();
    let lock = LockFactory::from_arc(store).create_lock("nobody-home");
    let err = lock.try_acquire().await.unwrap_err();
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(
        !text.contains("redacted") && !text.contains("secret"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_carry_the_writers_fencing_token() {
    let server = RedisServer::start();
    let url = server.url(0).replacen("redis://", "redis+pubsub://", 1);
    let store = RedisPubSubStore::from_dsn(&url).unwrap();
    let lock = LockFactory::new(store.clone()).create_lock("fenced");
    assert!(lock.try_acquire().await.unwrap());
    let holders = store.holders("fenced").await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(
        holders[0].fencing_token,
        lock.fencing_token(),
        "{holders:?}"
    );
    let _ = lock.release().await.unwrap();
}
