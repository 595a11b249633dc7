//! Our holder records beside the peers' locks: a Python or Symfony holder is listed with what
//! its entry tells (no record), and the peers acquire, promote and release as before while our
//! records exist (they live outside the lock's sorted set).

use xtr_lock::{Lockable as _, Mode, Store as _};
use xtr_lock_testkit::redis::RedisServer;

use crate::support::on_redis::{TTL, lock, store};
use crate::support::peer::Peer;

#[tokio::test]
async fn python_and_symfony_holders_are_listed_beside_ours() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut py = Peer::python("redis", &server.url(0));
    let mut php = Peer::symfony(server.port());
    assert_eq!(py.call_ttl("try_write", "l/py", Some(30.0)), true);
    assert_eq!(py.call_ttl("try_read", "l/pyr", Some(30.0)), true);
    assert_eq!(php.call_ttl("try_write", "l/sf", Some(30.0)), true);
    let ours = lock(&store, "l/ours", TTL)
        .with_meta(b"ours".to_vec())
        .unwrap();
    assert!(ours.try_acquire().await.unwrap());
    let mut listed = store.list("l/").await.unwrap();
    listed.sort_by(|a, b| a.resource.cmp(&b.resource));
    let names: Vec<&str> = listed.iter().map(|l| l.resource.as_str()).collect();
    assert_eq!(names, ["l/ours", "l/py", "l/pyr", "l/sf"], "{listed:#?}");
    let modes: Vec<Mode> = listed.iter().map(|l| l.holders[0].mode).collect();
    assert_eq!(modes, [Mode::Write, Mode::Write, Mode::Read, Mode::Write]);
    assert_eq!(listed[0].holders[0].meta.as_deref(), Some(&b"ours"[..]));
    for peer in &listed[1..] {
        let h = &peer.holders[0];
        assert!(h.meta.is_none() && h.acquired_at.is_none(), "{h:?}");
        assert!(h.remaining.is_some() && h.id.is_some(), "{h:?}");
    }
    py.call("release", "l/py");
    py.call("release", "l/pyr");
    php.call("release", "l/sf");
    let listed = store.list("l/").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:#?}");
    let _ = ours.release().await.unwrap();
}

#[tokio::test]
async fn peers_acquire_promote_and_release_beside_our_records() {
    let server = RedisServer::start();
    let store = store(&server);
    let mut py = Peer::python("redis", &server.url(0));
    let mut php = Peer::symfony(server.port());
    let ours = lock(&store, "rw", TTL)
        .with_meta(b"reader".to_vec())
        .unwrap();
    assert!(ours.try_acquire_read().await.unwrap());
    assert_eq!(
        py.call_ttl("try_read", "rw", Some(30.0)),
        true,
        "readers share"
    );
    assert_eq!(
        py.call("try_write", "rw"),
        false,
        "no promotion beside our reader"
    );
    let _ = ours.release().await.unwrap();
    assert_eq!(
        py.call("try_write", "rw"),
        true,
        "Python's sole reader promotes"
    );
    assert!(!ours.try_acquire_read().await.unwrap());
    py.call("release", "rw");
    assert_eq!(
        server.cli(&["EXISTS", "rw"]),
        "0",
        "nothing of ours is left in the set"
    );

    assert!(ours.try_acquire_read().await.unwrap());
    assert_eq!(php.call_ttl("try_read", "rw", Some(30.0)), true);
    let _ = ours.release().await.unwrap();
    assert_eq!(
        php.call("try_write", "rw"),
        true,
        "Symfony's sole reader promotes"
    );
    assert!(!ours.try_acquire().await.unwrap());
    php.call("release", "rw");

    assert!(ours.try_acquire().await.unwrap());
    assert_eq!(
        server.cli(&["ZCARD", "rw"]),
        "2",
        "a token and the marker, nothing more"
    );
    assert_eq!(py.call("try_write", "rw"), false);
    assert_eq!(php.call("try_write", "rw"), false);
    let _ = ours.release().await.unwrap();
    assert_eq!(py.call("try_write", "rw"), true);
    py.call("release", "rw");
    assert_eq!(php.call("try_write", "rw"), true);
    php.call("release", "rw");
}
