//! Each store beyond the conformance suite, faults included, on real throwaway servers the
//! testkit starts: a module per store (or per side of one: `redis_connections`, `sql_lost_answer`
//! …). `cargo nextest run -p xtr-lock --test stores -E 'test(/^redis/)'` runs Redis's.
//! The tests against Python and PHP processes are in the `peers` binary.

#[path = "../support/mod.rs"]
mod support;

mod advisory;
mod bounded_calls;
mod combined;
mod combined_faults;
mod etcd;
mod etcd_elect;
mod etcd_faults;
mod etcd_paused_member;
mod etcd_semaphore;
mod flock;
mod flock_loss;
mod flock_semaphore;
mod getlock;
mod memcached;
mod memcached_records;
mod memcached_semaphore;
mod pubsub;
mod pubsub_liveness;
mod quorum_lease;
mod redis;
mod redis_cluster;
mod redis_cluster_faults;
mod redis_connections;
mod redis_durability;
mod redis_fair;
mod redis_fencing;
mod redis_handoff;
mod redis_hostile;
mod redis_observers;
mod redis_records;
mod redis_semaphore;
mod redis_sentinel;
mod redis_subscribers;
mod redis_topologies;
mod redis_waking;
mod release_after;
mod sem_common;
mod semaphore;
mod session_lease;
mod sql;
mod sql_deadlock;
mod sql_errors;
mod sql_fair;
mod sql_lost_answer;
mod sql_semaphore;
mod store_check;
mod sysv_semaphore;
