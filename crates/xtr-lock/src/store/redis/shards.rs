//! A cluster's subscriber state: which slots' wake channels are subscribed, on which
//! connection (see `sharded.rs`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures_util::future::Shared;
use redis::cluster_async::ClusterConnection;

use crate::clock::BoxFuture;

/// A cluster's subscriber state.
#[derive(Default)]
pub(super) struct Shards {
    /// The subscriber connection: its pushes go to the reader task.
    pub(super) conn: Option<ClusterConnection>,
    /// Slots whose channel the server acknowledged.
    pub(super) live: HashSet<u16>,
    /// Subscriptions under way, by slot (each in a task of its own, shared by its waiters).
    pub(super) pending: HashMap<u16, Shared<BoxFuture<'static, bool>>>,
    pub(super) reader: Option<tokio::task::AbortHandle>,
    /// After a failure: no new try before this instant, and the pause (doubling).
    pub(super) retry_at: Option<(tokio::time::Instant, Duration)>,
}

impl Shards {
    pub(super) fn is_live(&self, slot: u16) -> bool {
        self.live.contains(&slot)
    }

    /// Drops the subscriber connection and its reader.
    pub(super) fn close(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
        self.conn = None;
        self.live.clear();
    }
}
