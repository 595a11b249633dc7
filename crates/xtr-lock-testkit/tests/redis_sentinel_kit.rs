//! The Redis Sentinel helper starts what it says: a master, its replica and three sentinels
//! that agree; a killed master replaced by its replica; roles swapped on request.

use std::time::Instant;

use xtr_lock_testkit::redis_sentinel::RedisSentinelGroup;

#[test]
fn a_group_comes_up_and_killing_the_master_promotes_the_replica() {
    let began = Instant::now();
    let mut group = RedisSentinelGroup::start("testkit-master");
    eprintln!("sentinel group ready in {:?}", began.elapsed());
    let sentinels = group.sentinel_ports();
    assert_eq!(sentinels.len(), 3);
    let seeds: Vec<String> = sentinels.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    assert_eq!(
        group.dsn(),
        format!("redis+sentinel://{}/testkit-master/0", seeds.join(","))
    );
    let [first, second] = group.server_ports()[..] else {
        panic!("two data servers")
    };
    assert_eq!(group.master_port(), first);
    assert_eq!(group.replica_ports(), vec![second]);
    assert_eq!(group.cli(first, &["SET", "testkit-key", "kept"]), "OK");
    assert_eq!(group.cli(first, &["WAIT", "1", "5000"]), "1");

    let began = Instant::now();
    let promoted = group.kill_master();
    eprintln!("kill_master took {:?}", began.elapsed());
    assert_eq!(promoted, second);
    for s in sentinels {
        let addr = group.cli(
            s,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "testkit-master"],
        );
        assert!(
            addr.ends_with(&second.to_string()),
            "sentinel {s} says {addr}"
        );
    }
    assert_eq!(group.cli(second, &["GET", "testkit-key"]), "kept");

    let began = Instant::now();
    group.restart(first);
    eprintln!(
        "the killed master rejoined as a replica in {:?}",
        began.elapsed()
    );
    assert_eq!(group.master_port(), second);
    assert_eq!(group.replica_ports(), vec![first]);
}

#[test]
fn a_failover_swaps_the_master_and_its_replica() {
    let group = RedisSentinelGroup::start("testkit-swap");
    let [first, second] = group.server_ports()[..] else {
        panic!("two data servers")
    };
    let began = Instant::now();
    let new = group.failover();
    eprintln!("SENTINEL FAILOVER took {:?}", began.elapsed());
    assert_eq!(new, second);
    assert_eq!(group.master_port(), second);
    assert_eq!(group.replica_ports(), vec![first]);
}

#[test]
fn a_sentinel_killed_and_restarted_rejoins() {
    let mut group = RedisSentinelGroup::start("testkit-sentinel");
    let sentinel = group.sentinel_ports()[0];
    group.kill(sentinel);
    let master = group.master_port();
    group.restart(sentinel);
    assert_eq!(group.master_port(), master);
}

#[test]
fn a_paused_master_is_replaced_and_replicates_once_resumed() {
    let group = RedisSentinelGroup::start("testkit-pause");
    let [first, second] = group.server_ports()[..] else {
        panic!("two data servers")
    };
    group.pause(first);
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while group.master_port() != second {
        assert!(
            Instant::now() < deadline,
            "the paused master is never replaced"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    group.resume(first);
    let began = Instant::now();
    group.wait_healthy();
    eprintln!(
        "the resumed master replicated the new one after {:?}",
        began.elapsed()
    );
    assert_eq!(group.replica_ports(), vec![first]);
}
