//! The etcd helpers start what they say: a single member, a 3-member cluster with one leader,
//! members that stop, pause and come back.

use xtr_lock_testkit::etcd::EtcdCluster;

#[test]
fn a_three_member_cluster_elects_a_new_leader_when_its_leader_dies() {
    let mut cluster = EtcdCluster::start(3);
    assert_eq!(cluster.endpoints().len(), 3);
    let leader = cluster.wait_leader();
    cluster.etcdctl_output(&["put", "k", "v"]);
    cluster.kill(leader);
    let next = cluster.wait_leader();
    assert_ne!(next, leader, "a new leader among the two left");
    assert!(cluster.etcdctl_output(&["get", "k"]).contains('v'));
    cluster.restart(leader);
    cluster.etcdctl_output(&["put", "k", "w"]);
}

#[test]
fn a_single_member_answers_etcdctl() {
    let cluster = EtcdCluster::single();
    assert_eq!(cluster.wait_leader(), 0);
    cluster.etcdctl_output(&["put", "a", "1"]);
    assert!(cluster.etcdctl_output(&["get", "a"]).contains('1'));
}
