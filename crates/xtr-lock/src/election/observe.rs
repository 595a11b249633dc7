//! [`Observer`]: every change of an election's leader, woken by the store where it can notify,
//! polling where it cannot.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;

use super::Leader;
use crate::error::Result;
use crate::key::Mode;
use crate::store::Store;

/// How often an observer looks when the store cannot tell it of every change (a release it
/// did not see, an acquisition it is never told of).
pub(crate) const DEFAULT_POLL: Duration = Duration::from_millis(500);

/// The leader of election `name` on `store`: the first live writer it lists.
pub(super) async fn leader_of(store: &dyn Store, name: &str) -> Result<Option<Leader>> {
    let holders = store.holders(name).await?;
    Ok(holders
        .into_iter()
        .find(|h| !h.waiting && h.mode == Mode::Write)
        .map(Leader::from_holder))
}

/// Every change of an election's leader, from [`Election::observe`](super::Election::observe):
/// [`next`](Observer::next) answers the current leader first, then each time another leads
/// (or the same holder changes its value), and `None` while nobody leads.
///
/// Where the store notifies observers
/// ([`Store::watch_changes`](crate::Store::watch_changes): etcd, Redis releases, the SQL table
/// on PostgreSQL, the in-memory store) it waits for the store's word, and for the leader's
/// lease to run out; elsewhere it looks twice a second (or as often as
/// [`with_poll`](Observer::with_poll) says). An observer holds nothing and takes no place in any
/// queue.
pub struct Observer {
    store: Arc<dyn Store>,
    name: String,
    poll: Duration,
    /// The last answer: `None` before the first.
    last: Option<Option<Leader>>,
}

impl Observer {
    pub(super) fn new(store: Arc<dyn Store>, name: String) -> Self {
        Observer {
            store,
            name,
            poll: DEFAULT_POLL,
            last: None,
        }
    }

    /// Looks every `poll` where the store cannot notify (at least 10 ms).
    #[must_use]
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll.max(Duration::from_millis(10));
        self
    }

    /// The leader now, the first time; afterwards, waits for the next change and answers the
    /// new leader (`None`: nobody leads). Changes that come and go between two calls may be
    /// missed: each answer differs from the one before.
    ///
    /// # Errors
    ///
    /// A store failure (the next call tries again); `Unsupported` on stores that cannot tell
    /// who holds a lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a dropped call loses nothing (the next one compares with the last answer).
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            // Registered before looking, so a change right after the look wakes it.
            let watcher = self.store.watch_changes(&self.name).await?;
            let now = leader_of(self.store.as_ref(), &self.name).await?;
            let changed = match &self.last {
                None => true,
                Some(last) => match (last, &now) {
                    (Some(a), Some(b)) => !a.same_as(b),
                    (a, b) => a.is_some() != b.is_some(),
                },
            };
            if changed {
                self.last = Some(now.clone());
                return Ok(now);
            }
            // A lease that runs out is no release anyone announces: look again when it ends.
            let expiry = now
                .as_ref()
                .and_then(|l| l.remaining)
                .map(|d| d + Duration::from_millis(5));
            match watcher {
                Some(w) if w.sees_every_release() => match expiry {
                    Some(d) => {
                        let _ = tokio::time::timeout(d, w).await;
                    }
                    None => w.await,
                },
                w => {
                    let wait = expiry.map_or(self.poll, |d| d.min(self.poll));
                    match w {
                        Some(w) => {
                            let _ = tokio::time::timeout(wait, w).await;
                        }
                        None => tokio::time::sleep(wait).await,
                    }
                }
            }
        }
    }

    /// The changes as a stream (of [`next`](Observer::next)'s answers; it never ends).
    pub fn into_stream(self) -> impl Stream<Item = Result<Option<Leader>>> + Send {
        futures_util::stream::unfold(self, |mut observer| async move {
            let item = observer.next().await;
            Some((item, observer))
        })
    }
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("name", &self.name)
            .field("poll", &self.poll)
            .finish_non_exhaustive()
    }
}
