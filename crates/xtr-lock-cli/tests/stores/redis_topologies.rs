//! `xtr-lock` on a Redis Cluster (`redis+cluster://`, and Symfony's `redis_cluster=1` form)
//! and on a master found through Sentinel (`redis+sentinel://`): the command runs under the
//! lock, whose key is on the server that serves it, and a second `run -n` is refused meanwhile.

use xtr_lock_testkit::redis_cluster::RedisCluster;
use xtr_lock_testkit::redis_sentinel::RedisSentinelGroup;

use crate::common::{run_holding, stop, xtr};

/// `run --store <dsn> <resource> -- true` exits 0.
fn runs(dsn: &str, resource: &str) {
    let out = xtr()
        .args(["run", "--store", dsn, resource, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{dsn}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `run -n` exits 1 (held by someone else).
fn refused(dsn: &str, resource: &str) {
    let out = xtr()
        .args(["run", "-n", "--store", dsn, resource, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{dsn}: {out:?}");
}

#[test]
fn run_on_a_cluster_holds_the_key_on_its_master_in_both_dsn_forms() {
    let cluster = RedisCluster::start(3, 0);
    let hosts: Vec<String> = cluster
        .masters()
        .iter()
        .map(|p| format!("host[127.0.0.1:{p}]"))
        .collect();
    let symfony_form = format!("redis:?{}&redis_cluster=1", hosts.join("&"));
    let dsn = cluster.dsn();
    runs(&dsn, "r");
    runs(&symfony_form, "r");
    let tmp = tempfile::tempdir().unwrap();
    for (i, resource) in ["cli-a", "cli-b", "{tag}:cli"].into_iter().enumerate() {
        let (run, _command) = run_holding(
            &["run", "--store", &dsn, resource],
            &tmp.path().join(format!("pid-{i}")),
        );
        let master = cluster.master_of_slot(RedisCluster::slot_of(resource.as_bytes()));
        assert_eq!(
            cluster.cli(master, &["EXISTS", resource]),
            "1",
            "{resource}"
        );
        refused(&dsn, resource);
        refused(&symfony_form, resource);
        stop(run);
        assert_eq!(
            cluster.cli(master, &["EXISTS", resource]),
            "0",
            "{resource}"
        );
        runs(&symfony_form, resource);
    }
}

#[test]
fn run_on_sentinel_holds_the_key_on_the_master() {
    let group = RedisSentinelGroup::start("cli");
    let dsn = group.dsn();
    runs(&dsn, "r");
    let tmp = tempfile::tempdir().unwrap();
    let (run, _command) = run_holding(&["run", "--store", &dsn, "s"], &tmp.path().join("pid"));
    assert_eq!(group.cli(group.master_port(), &["EXISTS", "s"]), "1");
    refused(&dsn, "s");
    stop(run);
    runs(&dsn, "s");
}
