//! Locks on a Redis Cluster: resource names and prefixes with braces anywhere land on every
//! master and lock, exclude, wake and release there, semaphores too; a prefix whose first
//! braces are empty is refused; a slot moved back and forth under contention loses no lock,
//! lets nobody in twice and strands no waiter.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xtr_lock::{ErrorKind, LockFactory, Lockable as _, ManualClock, RedisStore, Release};
use xtr_lock_testkit::redis_cluster::RedisCluster;

use crate::redis_cluster_faults::{Tally, contend};
use crate::support::sections::Sections;

/// How long a woken waiter may take to get in (a loaded machine; a missed wake is forever).
const WOKEN: Duration = Duration::from_secs(10);

/// Names with braces in every position, each shape in `n` variants whose hash tag (or whole
/// key) differs, unicode included.
fn braced_names(n: usize) -> Vec<String> {
    (0..n)
        .flat_map(|i| {
            [
                format!("{{a{i}}}"),
                format!("a{{b{i}}}c"),
                format!("{{}}{i}"),
                format!("x}}y{{z{i}}}"),
                format!("é{{ü{i}}}ß"),
            ]
        })
        .collect()
}

/// Locks on `store` whose clock never moves: no poll and no lease-hint sleep ever ends, so a
/// waiter gets in only when a release wakes it.
fn frozen(store: &RedisStore) -> LockFactory {
    LockFactory::new(store.clone())
        .with_clock(Arc::new(ManualClock::frozen()))
        .with_ttl(Some(Duration::from_secs(30)))
}

/// `name` is locked, excludes a second holder, wakes it on release and is released by it.
async fn lock_round(factory: &LockFactory, name: &str) {
    let first = factory.create_lock(name);
    assert!(first.try_acquire().await.unwrap(), "{name:?}: free");
    let token = first.fencing_token().expect("Redis fences");
    let second = factory.create_lock(name);
    assert!(!second.try_acquire().await.unwrap(), "{name:?}: excluded");
    let waiting = tokio::spawn(async move {
        second.acquire().await.unwrap();
        second
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(first.release().await.unwrap(), Release::Released);
    let second = tokio::time::timeout(WOKEN, waiting)
        .await
        .unwrap_or_else(|_| panic!("{name:?}: the waiter was never woken"))
        .unwrap();
    assert!(second.fencing_token() > Some(token), "{name:?}: fenced");
    assert_eq!(second.release().await.unwrap(), Release::Released);
}

/// A semaphore of two on `name`: two hold, a third waits and is woken by a release.
async fn semaphore_round(factory: &LockFactory, name: &str) {
    let sem = |_| factory.create_semaphore(name, 2).unwrap();
    let (a, b, c) = (sem(0), sem(1), sem(2));
    assert!(a.try_acquire().await.unwrap(), "{name:?}: first permit");
    assert!(b.try_acquire().await.unwrap(), "{name:?}: second permit");
    assert!(!c.try_acquire().await.unwrap(), "{name:?}: no third");
    let waiting = tokio::spawn(async move {
        c.acquire().await.unwrap();
        c
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(a.release().await.unwrap(), Release::Released);
    let c = tokio::time::timeout(WOKEN, waiting)
        .await
        .unwrap_or_else(|_| panic!("{name:?}: the semaphore's waiter was never woken"))
        .unwrap();
    for s in [b, c] {
        assert_eq!(s.release().await.unwrap(), Release::Released);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn braces_in_names_and_prefixes_lock_wake_and_release_on_every_master() {
    let began = Instant::now();
    let cluster = RedisCluster::start(3, 0);
    let base = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let masters: BTreeSet<u16> = cluster.masters().into_iter().collect();
    let names = braced_names(4);
    for prefix in ["app:", "{tenant}:", "t{a", ""] {
        let store = base.with_prefix(prefix);
        let slots: BTreeSet<u16> = names
            .iter()
            .map(|n| RedisCluster::slot_of(store.key_for(n).as_bytes()))
            .collect();
        let reached: BTreeSet<u16> = slots.iter().map(|&s| cluster.master_of_slot(s)).collect();
        if prefix.starts_with("{tenant}") {
            // The prefix's braces are the hash tag of every key: one slot for all.
            assert_eq!(slots.len(), 1, "prefix {prefix:?}: {slots:?}");
        } else {
            assert_eq!(
                reached, masters,
                "prefix {prefix:?}: every master gets some"
            );
        }
        let factory = frozen(&store);
        for name in &names {
            lock_round(&factory, name).await;
            semaphore_round(&factory, name).await;
        }
    }
    eprintln!("took {:?}", began.elapsed());
}

/// Random names of braces, colons and letters (up to 24 characters) under random prefixes: each
/// lock key hashes where the server says (`CLUSTER KEYSLOT`), and a save, a refused save that
/// queues, a release that wakes and a semaphore's permit work on it (a companion key in another
/// slot would fail the script with CROSSSLOT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_braced_names_keep_their_companions_in_their_slot() {
    let cluster = RedisCluster::start(3, 0);
    let base = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let port = cluster.masters()[0];
    let alphabet: Vec<char> = "{}{}:ab}x{".chars().collect();
    let word = |max: usize| -> String {
        let len = 1 + rand::random::<u32>() as usize % max;
        (0..len)
            .map(|_| alphabet[rand::random::<u32>() as usize % alphabet.len()])
            .collect()
    };
    for round in 0..200 {
        let prefix = if round % 4 == 0 {
            String::new()
        } else {
            word(6)
        };
        let name = word(24);
        // Prefixes whose first braces are empty are refused (tested above); not chosen here.
        let Ok(store) =
            RedisStore::from_dsn(&format!("{}?prefix={}", cluster.dsn(), url_escape(&prefix)))
        else {
            continue;
        };
        let key = store.key_for(&name);
        let said = cluster.cli(port, &["CLUSTER", "KEYSLOT", &key]);
        assert_eq!(
            said,
            RedisCluster::slot_of(key.as_bytes()).to_string(),
            "{prefix:?} {name:?}"
        );
        let factory = frozen(&store);
        let (a, b) = (factory.create_lock(&name), factory.create_lock(&name));
        assert!(a.try_acquire().await.unwrap(), "{prefix:?} {name:?}");
        assert!(!b.try_acquire().await.unwrap(), "{prefix:?} {name:?}");
        assert_eq!(a.release().await.unwrap(), Release::Released);
        assert!(b.try_acquire().await.unwrap(), "{prefix:?} {name:?}");
        assert_eq!(b.release().await.unwrap(), Release::Released);
        match factory
            .create_semaphore(&name, 2)
            .unwrap()
            .try_acquire()
            .await
        {
            Ok(got) => assert!(got, "{prefix:?} {name:?}"),
            // Names whose Symfony keys hash apart are refused, saying so.
            Err(err) => assert!(err.to_string().contains("hash slots"), "{err}"),
        }
    }
    drop(base);
}

/// `s` percent-encoded for a DSN's option value.
fn url_escape(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_with_empty_first_braces_is_refused_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    for prefix in ["%7B%7D", "a%7B%7Db", "x%7B%7D%7By%7D"] {
        let err = RedisStore::from_dsn(&format!("{}?prefix={prefix}", cluster.dsn()))
            .expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        let text = err.to_string();
        assert!(text.contains("empty") && text.contains("{}"), "{text}");
        assert!(!text.contains('\n'), "one line: {text}");
    }
    // Braces that are not empty are fine.
    let store = RedisStore::from_dsn(&format!("{}?prefix=%7Bt%7D%7B%7D", cluster.dsn())).unwrap();
    let lock = frozen(&store).create_lock("r");
    assert!(lock.try_acquire().await.unwrap());
    assert_eq!(lock.release().await.unwrap(), Release::Released);
    // A semaphore whose Symfony keys ({name}:time, {name}:weight) would hash apart: refused,
    // saying why, before anything is written; a close name that keeps them together works.
    let plain = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let factory = frozen(&plain);
    let refused = factory.create_semaphore("}x", 2).unwrap();
    let err = refused.try_acquire().await.expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("hash slots"), "{err}");
    let fine = factory.create_semaphore("x}", 2).unwrap();
    assert!(fine.try_acquire().await.unwrap());
    assert_eq!(fine.release().await.unwrap(), Release::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_back_and_forth_under_contention_loses_no_lock_and_strands_no_waiter() {
    slot_moved_under_contention(0, "").await;
}

/// The same with a replica per master and `wait_replicas=1`: each save's `WAIT` goes to the
/// slot's master of the moment; a save caught by the move fails as a temporary error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_under_contention_with_wait_replicas_loses_no_lock() {
    slot_moved_under_contention(1, "?wait_replicas=1&wait_timeout=0.5").await;
}

async fn slot_moved_under_contention(replicas: usize, options: &str) {
    let began = Instant::now();
    let cluster = Arc::new(RedisCluster::start(3, replicas));
    // Three resources in one slot (one hash tag), so that moving it moves all their keys.
    let tag = format!("{{moving-{:04x}}}", rand::random::<u16>());
    let resources: Vec<String> = (0..3).map(|i| format!("{tag}{i}")).collect();
    let slot = RedisCluster::slot_of(resources[0].as_bytes());
    let home = cluster.master_of_slot(slot);
    let away = *cluster.masters().iter().find(|&&m| m != home).unwrap();
    let store = RedisStore::from_dsn(&format!("{}{options}", cluster.dsn())).unwrap();
    let factory = frozen(&store);
    let dir = tempfile::tempdir().unwrap();
    let sections = Sections::new(dir.path());
    let tally = Arc::new(Tally::default());
    let done = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let done = done.clone();
            tokio::spawn(contend(
                factory.clone(),
                resources.clone(),
                sections.clone(),
                format!("task-{i}"),
                tally.clone(),
                move || done.load(Ordering::SeqCst),
                WOKEN,
            ))
        })
        .collect();
    let mut moves = Vec::new();
    for to in [away, home, away, home] {
        let before = tally.sections.load(Ordering::SeqCst);
        let c = cluster.clone();
        let at = Instant::now();
        tokio::task::spawn_blocking(move || c.move_slots(&[slot], to))
            .await
            .unwrap();
        moves.push(at.elapsed());
        assert_eq!(cluster.master_of_slot(slot), to);
        // Contention goes on on the new owner before the next move.
        let deadline = Instant::now() + Duration::from_secs(20);
        while tally.sections.load(Ordering::SeqCst) < before + 25 {
            assert!(
                Instant::now() < deadline,
                "no sections after moving to {to}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    done.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let total: usize = resources.iter().map(|r| sections.check_tokens(r)).sum();
    let errors = tally.failures.lock().unwrap().clone();
    eprintln!(
        "{total} sections, {} errors, slot {slot} moved {home}<->{away} in {moves:?}; \
         test took {:?}",
        errors.len(),
        began.elapsed()
    );
    for (_, err) in errors.iter().take(5) {
        eprintln!("  {err}");
    }
    assert_eq!(tally.lost.load(Ordering::SeqCst), 0, "no lock lost");
    assert!(total >= 100, "{total} sections");
}

/// A release while the lock's slot is `MIGRATING` (its keys all still on the source node) either
/// releases, or fails as a temporary error having changed nothing; either way the waiter gets in
/// once the slot is stable again. Inside a script Redis refuses every access to a key that is
/// missing on a `MIGRATING` source: the release script once read the lock key again after
/// removing its last member, failed there after removing the lock (scripts are not rolled
/// back) and never woke the waiter (found by the resharding test above, one run in eight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_the_slot_migrates_wakes_the_waiter() {
    let cluster = RedisCluster::start(3, 0);
    let store = RedisStore::from_dsn(&cluster.dsn()).unwrap();
    let factory = frozen(&store);
    let name = "{migrating}r";
    let slot = RedisCluster::slot_of(name.as_bytes()).to_string();
    let from = cluster.master_of_slot(RedisCluster::slot_of(name.as_bytes()));
    let to = *cluster.masters().iter().find(|&&m| m != from).unwrap();
    let holder = factory.create_lock(name);
    holder.acquire().await.unwrap();
    let waiter = factory.create_lock(name);
    let waiting = tokio::spawn(async move { waiter.acquire().await.map(|()| waiter) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let id = |p: u16| cluster.cli(p, &["CLUSTER", "MYID"]);
    let set = |p: u16, state: &[&str]| {
        let mut args = vec!["CLUSTER", "SETSLOT", &slot];
        args.extend_from_slice(state);
        assert_eq!(cluster.cli(p, &args), "OK");
    };
    set(to, &["IMPORTING", &id(from)]);
    set(from, &["MIGRATING", &id(to)]);
    let released = holder.release().await;
    if let Err(err) = &released {
        assert!(err.is_temporary(), "{err:?}");
        assert!(
            holder.is_acquired().await.is_ok_and(|held| held),
            "untouched"
        );
    }
    set(from, &["STABLE"]);
    set(to, &["STABLE"]);
    if released.is_err() {
        assert_eq!(holder.release().await.unwrap(), Release::Released);
    }
    let waiter = tokio::time::timeout(WOKEN, waiting)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();
    assert_eq!(waiter.release().await.unwrap(), Release::Released);
}
