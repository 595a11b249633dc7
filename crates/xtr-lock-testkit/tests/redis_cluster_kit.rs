//! The Redis Cluster helper starts what it says: masters with replicas serving every slot, a
//! replica that takes over a killed master, roles swapped on request, slots moved with their
//! keys while a client keeps writing.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xtr_lock_testkit::redis_cluster::RedisCluster;

/// Runs `redis-cli -c -p <port> <args>`: redirections followed, as a cluster client does.
fn cli_c(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-c", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn a_cluster_comes_up_and_serves_a_key_through_any_node() {
    let began = Instant::now();
    let cluster = RedisCluster::start(3, 1);
    eprintln!("3+3 cluster ready in {:?}", began.elapsed());
    let masters = cluster.masters();
    assert_eq!((masters.len(), cluster.replicas().len()), (3, 3));
    for &m in &masters {
        assert_eq!(cluster.replicas_of(m).len(), 1, "one replica for {m}");
    }
    let seeds: Vec<String> = masters.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    assert_eq!(
        cluster.dsn(),
        format!("redis+cluster://{}", seeds.join(","))
    );
    let key = "testkit-cluster-key";
    let owner = cluster.master_of_slot(RedisCluster::slot_of(key.as_bytes()));
    let elsewhere = *masters.iter().find(|&&m| m != owner).unwrap();
    assert_eq!(cluster.cli(elsewhere, &["-c", "SET", key, "v1"]), "OK");
    assert_eq!(cluster.cli(owner, &["GET", key]), "v1");
    assert!(
        cluster.cli(elsewhere, &["GET", key]).contains("MOVED"),
        "a node that does not serve the slot redirects"
    );
}

#[test]
fn killing_a_master_promotes_its_replica_and_the_master_comes_back_as_a_replica() {
    let mut cluster = RedisCluster::start(3, 1);
    let key = "testkit-failover-key";
    let slot = RedisCluster::slot_of(key.as_bytes());
    let master = cluster.master_of_slot(slot);
    let replica = cluster.replicas_of(master)[0];
    assert_eq!(cluster.cli(master, &["SET", key, "kept"]), "OK");
    assert_eq!(cluster.cli(master, &["WAIT", "1", "5000"]), "1");

    let began = Instant::now();
    let promoted = cluster.failover_by_killing(master);
    eprintln!("fail-over by killing a master took {:?}", began.elapsed());
    assert_eq!(promoted, replica);
    assert_eq!(cluster.master_of_slot(slot), replica);
    assert!(!cluster.masters().contains(&master));
    assert_eq!(cluster.cli(replica, &["GET", key]), "kept");

    let began = Instant::now();
    cluster.restart(master);
    eprintln!(
        "the killed master rejoined as a replica in {:?}",
        began.elapsed()
    );
    assert_eq!(cluster.replicas_of(replica), vec![master]);
}

#[test]
fn a_manual_failover_swaps_a_master_and_its_replica() {
    let cluster = RedisCluster::start(3, 1);
    let master = cluster.masters()[0];
    let replica = cluster.replicas_of(master)[0];
    let began = Instant::now();
    cluster.manual_failover(replica);
    eprintln!("a manual fail-over took {:?}", began.elapsed());
    assert!(cluster.masters().contains(&replica));
    assert_eq!(cluster.replicas_of(replica), vec![master]);
}

#[test]
fn moving_a_slot_takes_its_keys_while_a_client_keeps_writing() {
    let cluster = RedisCluster::start(3, 0);
    let key = "{testkit-reshard}key";
    let counter = "{testkit-reshard}counter";
    let slot = RedisCluster::slot_of(key.as_bytes());
    let from = cluster.master_of_slot(slot);
    let to = *cluster.masters().iter().find(|&&m| m != from).unwrap();
    assert_eq!(cli_c(to, &["SET", key, "moved"]), "OK");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut done = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let reply = cli_c(to, &["INCR", counter]);
                assert!(
                    reply.parse::<u64>().is_ok(),
                    "INCR during the move: {reply}"
                );
                done += 1;
            }
            done
        })
    };
    // Let the writer start before the move.
    while cli_c(to, &["GET", counter]).is_empty() {}
    let began = Instant::now();
    cluster.move_slots(&[slot], to);
    eprintln!("moving one slot took {:?}", began.elapsed());
    stop.store(true, Ordering::Relaxed);
    let done = writer.join().expect("the writer never failed");

    assert_eq!(cluster.master_of_slot(slot), to);
    assert_eq!(cluster.cli(to, &["GET", key]), "moved");
    assert_eq!(cluster.cli(to, &["GET", counter]), done.to_string());
    assert!(cluster.cli(from, &["GET", key]).contains("MOVED"));

    let moved = cluster.reshard(100, from, to);
    assert_eq!(moved.len(), 100);
    assert!(moved.iter().all(|&s| cluster.master_of_slot(s) == to));
}

#[test]
fn a_paused_replica_is_counted_again_once_resumed() {
    let cluster = RedisCluster::start(3, 1);
    let replica = cluster.replicas()[0];
    cluster.pause(replica);
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.replicas().contains(&replica) {
        assert!(
            Instant::now() < deadline,
            "{replica} is never seen failed while paused"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.resume(replica);
    cluster.wait_healthy();
    assert!(cluster.replicas().contains(&replica));
}
