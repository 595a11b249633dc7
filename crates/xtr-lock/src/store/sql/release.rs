//! A release that leaves the row to run out (a minimum hold's way out).

use std::time::Duration;

use super::dialect::Flavor;
use super::ops::Run;
use super::{KIND, SqlStore, key_id, queries, wake_id};
use crate::error::{LostReason, Result};
use crate::key::Key;
use crate::store::Holding;
use crate::store::held::release_secs;

impl SqlStore {
    /// The holder's row (a lock's or a semaphore's) now ends no sooner than `after` from now
    /// on the database's clock: its expiration is put at the database's now (whole seconds,
    /// which a row may be taken up to 1 s before it) plus `after` rounded up and that second.
    /// The holder is forgotten here, as by a release, and the waiters are told to read the row
    /// again (in-process, and PostgreSQL's listeners): their last refusal said when the longer
    /// lifetime ended.
    pub(super) async fn release_later(&self, key: &Key, after: Duration) -> Result<Holding> {
        if !key.has_token(KIND) {
            return Ok(Holding::NotHeld(LostReason::Removed));
        }
        let ttl = Duration::from_secs(release_secs(after));
        let held = match key.permits() {
            Some(_) => self.sem_put_off(key, ttl).await?,
            None => self.put_off(key, ttl).await?,
        };
        let (id, token, wake) = (key_id(key.resource()), key.token(KIND), wake_id(key));
        if key.permits().is_none() {
            self.forget(&id, &token);
        }
        if held.is_held() {
            self.inner.wakers.notify(&wake);
            if self.inner.flavor == Flavor::Postgres {
                self.announce(key, wake).await;
            }
        }
        Ok(held)
    }

    /// Tells PostgreSQL's listeners (other processes' waiters) that `wake`'s row changed.
    /// Best effort: a waiter not told tries again when its last refusal's hint runs out.
    async fn announce(&self, key: &Key, wake: String) {
        let how = Run::plain(&self.inner);
        let told = self
            .run(key.resource(), how, move |conn, inner| {
                let wake = wake.clone();
                Box::pin(async move { queries::announce(conn, &inner.channel, &wake).await })
            })
            .await;
        if let Err(err) = told {
            tracing::debug!(target: crate::logging::TARGET, resource = key.resource(),
                error = %err, "cannot tell other processes' waiters that the lock ends sooner");
        }
    }
}
