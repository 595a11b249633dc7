//! The pub/sub store against real portalocker 4.4.2 processes on one throwaway Redis: both
//! directions of every exchange, the wire format byte for byte, elections across languages.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xtr_lock::{Lockable as _, Store as _};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::portalocker::{
    Py, SOON, channel, lock_on, now, python_probe, store, until_python_sees,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_against_exclusive_both_ways() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("excl");
    // Python holds: a Rust try fails, a blocking acquire gets it after the release.
    let mut py = Py::start(&server, &["hold", &c, "exclusive"]);
    py.expect("ACQUIRED", SOON).await;
    let rust = lock_on(&store, &c);
    assert!(!rust.try_acquire().await.unwrap(), "Python holds");
    // A timeout is a deadline: no attempt runs past it (portalocker's overran a 3 s timeout by
    // 0.76 s). The bound is generous for a loaded machine, far below one more probe's second.
    let asked = Instant::now();
    assert!(
        !rust
            .acquire_timeout(Duration::from_millis(500))
            .await
            .unwrap()
    );
    assert!(
        asked.elapsed() < Duration::from_millis(1200),
        "{:?}",
        asked.elapsed()
    );
    py.release();
    py.expect("RELEASED", SOON).await;
    assert!(
        rust.acquire_timeout(SOON).await.unwrap(),
        "acquired in time"
    );
    assert!(rust.is_acquired().await.unwrap());
    // Rust holds: a Python try fails, a Python holder gets it after our release.
    let mut attempt = Py::start(&server, &["try", &c, "exclusive"]);
    attempt.expect("NOT_ACQUIRED", SOON).await;
    assert_eq!(attempt.exit_code().await, 1);
    let mut py = Py::start(
        &server,
        &["hold", &c, "exclusive", "--check-interval", "0.02"],
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = rust.release().await.unwrap();
    py.expect("ACQUIRED", SOON).await;
    assert!(!rust.try_acquire().await.unwrap(), "Python holds now");
    py.release();
    py.expect("RELEASED", SOON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_across_languages_and_python_parses_ours() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("shared");
    let mut py = Py::start(&server, &["hold", &c, "shared"]);
    py.expect("ACQUIRED", SOON).await;
    let rust = lock_on(&store, &c);
    assert!(rust.try_acquire_read().await.unwrap(), "readers share");
    let records = python_probe(&server, &c).await;
    assert_eq!(records.len(), 2, "{records:?}");
    for r in &records {
        assert_eq!(r["mode"], "shared", "{r}");
        assert_eq!(r["elected"], false, "{r}");
        assert_eq!(r["legacy"], false, "{r}");
    }
    let ours = rust.key().holder_id("pubsub").unwrap();
    assert!(
        records
            .iter()
            .any(|r| r["holder_id"].as_str().unwrap().starts_with(&ours)),
        "our id {ours} is among {records:?}"
    );
    // And we see the Python reader.
    let holders = store.holders(&c).await.unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    let _ = rust.release().await.unwrap();
    py.release();
    py.expect("RELEASED", SOON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_writer_waits_on_a_python_reader_elected_and_blocking_new_readers() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("w-on-r");
    let mut reader = Py::start(&server, &["hold", &c, "shared"]);
    reader.expect("ACQUIRED", SOON).await;
    let writer = lock_on(&store, &c);
    let waiting = {
        let writer = writer.clone();
        tokio::spawn(async move { writer.acquire_timeout(SOON * 3).await })
    };
    // Elected behind the reader, still subscribed, answering: Python sees pending/true.
    until_python_sees(&server, &c, "never elected", |r| {
        r["mode"] == "pending" && r["elected"] == true
    })
    .await;
    let mut late = Py::start(&server, &["try", &c, "shared"]);
    late.expect("NOT_ACQUIRED", SOON).await;
    reader.release();
    reader.expect("RELEASED", SOON).await;
    assert!(waiting.await.unwrap().unwrap(), "acquired in time");
    assert!(writer.is_acquired().await.unwrap());
    let _ = writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_writer_waits_on_a_rust_reader_and_our_reader_then_waits() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("r-then-w");
    let reader = lock_on(&store, &c);
    assert!(reader.try_acquire_read().await.unwrap());
    let mut writer = Py::start(
        &server,
        &["hold", &c, "exclusive", "--check-interval", "0.02"],
    );
    // Once the Python writer is elected, a new Rust reader is refused.
    let second = lock_on(&store, &c);
    let deadline = Instant::now() + SOON;
    while second.try_acquire_read().await.unwrap() {
        let _ = second.release().await.unwrap();
        assert!(
            Instant::now() < deadline,
            "the Python writer never blocked readers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = reader.release().await.unwrap();
    writer.expect("ACQUIRED", SOON).await;
    assert!(!second.try_acquire_read().await.unwrap(), "Python writes");
    writer.release();
    writer.expect("RELEASED", SOON).await;
    assert!(
        second.acquire_read_timeout(SOON).await.unwrap(),
        "acquired in time"
    );
    let _ = second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elected_python_writer_is_deferred_to_by_a_lower_rust_id() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("defer");
    let reader = lock_on(&store, &c);
    assert!(reader.try_acquire_read().await.unwrap());
    let high = "f".repeat(32);
    let mut py = Py::start(
        &server,
        &[
            "hold",
            &c,
            "exclusive",
            "--holder-id",
            &high,
            "--check-interval",
            "0.02",
        ],
    );
    // The Python writer is elected behind our reader.
    until_python_sees(&server, &c, "never elected", |r| {
        r["holder_id"] == high.as_str() && r["elected"] == true
    })
    .await;
    // A Rust writer with a lower id (every id is below f…f) defers to the incumbent.
    let writer = lock_on(&store, &c);
    let rust_got_it = Arc::new(std::sync::Mutex::new(None::<f64>));
    let waiting = {
        let (writer, got) = (writer.clone(), rust_got_it.clone());
        tokio::spawn(async move {
            assert!(
                writer.acquire_timeout(SOON * 3).await.unwrap(),
                "acquired in time"
            );
            *got.lock().unwrap() = Some(now());
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = reader.release().await.unwrap();
    let py_at = py.stamp("ACQUIRED", SOON).await;
    assert!(rust_got_it.lock().unwrap().is_none(), "Python first");
    py.release();
    let released = py.stamp("RELEASING", SOON).await;
    waiting.await.unwrap();
    let ours = rust_got_it.lock().unwrap().unwrap();
    assert!(ours > py_at, "Rust after Python");
    assert!(ours >= released, "Rust after Python began to release");
    let _ = writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_replies_are_pythons_byte_for_byte_in_every_state() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("wire");
    let replies = |lines: Vec<String>| -> Vec<String> {
        lines
            .into_iter()
            .filter_map(|l| l.strip_prefix("REPLY ").map(str::to_owned))
            .collect()
    };
    let id_re = |reply: &str, mode: &str, elected: bool| {
        let prefix = "{\"holder_id\": \"";
        assert!(reply.starts_with(prefix), "{reply}");
        let id = &reply[prefix.len()..prefix.len() + 32];
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{reply}"
        );
        assert_eq!(
            reply,
            format!(
                "{{\"holder_id\": \"{id}\", \"mode\": \"{mode}\", \"protocol\": 1, \"elected\": {elected}}}"
            )
        );
    };
    // Shared.
    let reader = lock_on(&store, &c);
    assert!(reader.try_acquire_read().await.unwrap());
    let r = replies(Py::start(&server, &["ping", &c, "0.5"]).rest().await);
    assert_eq!(r.len(), 1, "{r:?}");
    id_re(&r[0], "shared", false);
    // Pending and elected, behind our reader; then exclusive.
    let writer = lock_on(&store, &c);
    let waiting = {
        let writer = writer.clone();
        tokio::spawn(async move { writer.acquire_timeout(SOON * 3).await })
    };
    let deadline = Instant::now() + SOON;
    loop {
        let r = replies(Py::start(&server, &["ping", &c, "0.3"]).rest().await);
        if r.iter()
            .any(|x| x.contains("\"pending\"") && x.ends_with("true}"))
        {
            let pending = r.iter().find(|x| x.contains("\"pending\"")).unwrap();
            id_re(pending, "pending", true);
            break;
        }
        assert!(Instant::now() < deadline, "never pending/true: {r:?}");
    }
    let _ = reader.release().await.unwrap();
    assert!(waiting.await.unwrap().unwrap(), "acquired in time");
    let r = replies(Py::start(&server, &["ping", &c, "0.5"]).rest().await);
    assert_eq!(r.len(), 1, "{r:?}");
    id_re(&r[0], "exclusive", true);
    let _ = writer.release().await.unwrap();
    // Exclusive through the fast path: elected false.
    let alone = lock_on(&store, &c);
    assert!(alone.try_acquire().await.unwrap());
    let r = replies(Py::start(&server, &["ping", &c, "0.5"]).rest().await);
    id_re(&r[0], "exclusive", false);
    let _ = alone.release().await.unwrap();
}

/// Writers of both languages pending behind a reader: the lowest id is elected and goes first
/// (a Python writer forced to 0…0), and every writer gets its turn, one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_writers_of_both_languages_elect_the_lowest_id_first() {
    let server = RedisServer::start();
    let store = store(&server);
    let c = channel("election");
    let reader = lock_on(&store, &c);
    assert!(reader.try_acquire_read().await.unwrap());
    let (low, high) = ("0".repeat(32), "f".repeat(32));
    let args = |id: &str| -> Vec<String> {
        [
            "hold",
            &c,
            "exclusive",
            "--holder-id",
            id,
            "--check-interval",
            "0.02",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let start = |id: &str| {
        let a = args(id);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Py::start(&server, &a)
    };
    let mut first = start(&low);
    // 0…0 is the incumbent before the others arrive.
    until_python_sees(&server, &c, "0…0 never elected", |r| {
        r["holder_id"] == low.as_str() && r["elected"] == true
    })
    .await;
    let mut last = start(&high);
    let writer = lock_on(&store, &c);
    let rust = {
        let writer = writer.clone();
        tokio::spawn(async move {
            assert!(writer.acquire_timeout(SOON * 3).await.unwrap());
            let at = now();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let until = now();
            let _ = writer.release().await.unwrap();
            (at, until)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = reader.release().await.unwrap();
    let first_at: f64 = first.stamp("ACQUIRED", SOON).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release();
    let first_until: f64 = first.stamp("RELEASING", SOON).await;
    let last_at: f64 = last.stamp("ACQUIRED", SOON * 2).await;
    last.release();
    let last_until: f64 = last.stamp("RELEASING", SOON).await;
    let (rust_at, rust_until) = rust.await.unwrap();
    assert!(first_at < rust_at && first_at < last_at, "0…0 first");
    for (a, b) in [
        ((first_at, first_until), (rust_at, rust_until)),
        ((first_at, first_until), (last_at, last_until)),
        ((rust_at, rust_until), (last_at, last_until)),
    ] {
        assert!(
            !(a.0 < b.1 && b.0 < a.1),
            "one writer at a time: {a:?} {b:?}"
        );
    }
}
