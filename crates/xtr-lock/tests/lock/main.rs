//! The front end: acquiring and waiting, scopes, cancellation, the blocking API, siblings (clones
//! of one holder), a lease while the store is slow, late requests, the lock configuration and
//! its registry, metrics and logs. One module per area; `cargo nextest run -p xtr-lock --test
//! lock`, or `-E 'test(/^scope::/)'` for one of them.

#[path = "../support/mod.rs"]
mod support;

mod acquire;
mod blocking;
mod cancel;
mod config;
mod election;
mod jobs;
mod late_requests;
mod liveness;
mod lock;
mod locks_registry;
mod newcomer;
mod observability;
mod scope;
mod scoped_reads;
mod semaphore;
mod siblings;
