//! Test support for xtr-lock: the real peers and servers the tests talk to, set up on demand.
//!
//! Nothing here is a mock. Each helper either provides the real thing or fails with a message
//! saying what is missing and how to install it; no test is ever skipped silently.

pub mod delay_proxy;
pub mod etcd;
pub mod hook_proxy;
pub mod mariadb;
pub mod memcached;
pub mod postgres;
mod process;
pub mod proxy;
pub mod python;
pub mod redis;
pub mod redis_cluster;
pub mod redis_sentinel;
mod resp;
pub mod slow_answers;
pub mod user;
