//! The stores against other programs on the same locks: Python xtr-lock 4.1.0 and portalocker
//! 4.4.2 (from PyPI, in a venv the testkit makes), Symfony Lock (PHP) and flock(1). Their
//! scripts are beside this file (`lock_peer.py`, `lock_peer.php`, `pubsub_peer.py`,
//! `symfony_holder.php`, `semaphore_peer.php`), on one Redis server and on a Redis Cluster. A module
//! per store.

#[path = "../support/mod.rs"]
mod support;

mod advisory;
mod flock;
mod flock_listing;
mod flock_semaphore;
mod pubsub;
mod pubsub_faults;
mod redis;
mod redis_cluster;
mod redis_records;
mod redis_semaphore;
mod sql;
mod sql_listing;
