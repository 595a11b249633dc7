//! A release that leaves the entries to run out (a minimum hold's way out).

use std::time::Duration;

use super::{HolderState, KIND, MAX_TTL_SECS, MemcachedStore};
use crate::error::{LostReason, Result};
use crate::key::Key;
use crate::mutex::lock;
use crate::store::held::release_secs;
use crate::store::{Holding, Store as _};

impl MemcachedStore {
    /// The holder's entry (a lock's, or a semaphore holder's slots) and its record now end no
    /// sooner than `after` from now on the server's clock: their exptime is `after` rounded up
    /// to whole seconds plus the second Memcached's clock may end them early. The holder is
    /// forgotten here, as by a release, and this store's waiters read the entry again. `None`
    /// past Memcached's 30 days (a longer exptime is read as a Unix timestamp): the lock then
    /// keeps holding.
    pub(super) async fn release_later(
        &self,
        key: &Key,
        after: Duration,
    ) -> Result<Option<Holding>> {
        let secs = release_secs(after);
        if secs > MAX_TTL_SECS {
            return Ok(None);
        }
        if !key.has_token(KIND) {
            return Ok(Some(Holding::NotHeld(LostReason::Removed)));
        }
        let held = self
            .put_off_expiration(key, Duration::from_secs(secs))
            .await?;
        *lock(&key.handle::<HolderState>(self.inner.owner).acquired_at) = None;
        match key.permits() {
            Some(_) => lock(&self.inner.wakers).notify(&Self::sem_wake(key.resource())),
            None => self.forget(key.resource(), &key.token(KIND)),
        }
        Ok(Some(held))
    }
}
