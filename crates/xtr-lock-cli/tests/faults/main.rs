//! The `xtr-lock` command when things go wrong: the fault suite's short form (`faults`, run two
//! at a time: see `.config/nextest.toml`), a slow or missing store (`liveness`), requests that
//! land late (`late_requests`), waiters in several processes (`waking`).

#[path = "../common/mod.rs"]
mod common;

mod faults;
mod late_requests;
mod liveness;
mod waking;
