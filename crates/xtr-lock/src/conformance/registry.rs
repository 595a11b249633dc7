//! A store wrapper for the fair-waiting scenarios: it sees a waiter registered (a watch, then
//! a refused save: every queue of this library has the waiter by then) and leaving (its last
//! watcher dropped), on any store whose waits go through [`Store::watch`]. Stores that wait
//! natively are seen through the waiters they show instead.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::key::Key;
use crate::store::{
    Capabilities, HolderInfo, Holding, Listing, LossWatcher, Saved, Store, StoreWarning, Usage,
    Watcher,
};

/// Holders with live watchers: how many, and whether a save of theirs was refused since.
#[derive(Default)]
pub(super) struct Registrations(Mutex<Vec<(Key, usize, bool)>>);

impl Registrations {
    /// Registered waiters on `resource`.
    pub(super) fn count(&self, resource: &str) -> usize {
        let regs = self.0.lock().unwrap();
        regs.iter()
            .filter(|(k, n, refused)| k.resource() == resource && *n > 0 && *refused)
            .count()
    }

    fn watched(&self, key: &Key) {
        let mut regs = self.0.lock().unwrap();
        match regs.iter_mut().find(|(k, ..)| Key::same_holder(k, key)) {
            Some(r) => r.1 += 1,
            None => regs.push((key.clone(), 1, false)),
        }
    }

    fn unwatched(&self, key: &Key) {
        let mut regs = self.0.lock().unwrap();
        if let Some(i) = regs.iter().position(|(k, ..)| Key::same_holder(k, key)) {
            regs[i].1 -= 1;
            if regs[i].1 == 0 {
                regs.remove(i);
            }
        }
    }

    fn saved(&self, key: &Key, saved: &Result<Saved>) {
        let mut regs = self.0.lock().unwrap();
        if let Some(r) = regs.iter_mut().find(|(k, ..)| Key::same_holder(k, key)) {
            r.2 = matches!(saved, Ok(Saved::Conflict(_)));
        }
    }
}

/// A watcher's hold on its registration.
struct Watching(Arc<Registrations>, Key);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.unwatched(&self.1);
    }
}

/// The store under test, seen by [`Registrations`].
pub(super) struct Observed {
    pub(super) inner: Arc<dyn Store>,
    pub(super) regs: Arc<Registrations>,
}

impl fmt::Display for Observed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl fmt::Debug for Observed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

#[async_trait]
impl Store for Observed {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        let saved = self.inner.save(key, ttl).await;
        self.regs.saved(key, &saved);
        saved
    }
    async fn save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        let saved = self.inner.save_read(key, ttl).await;
        self.regs.saved(key, &saved);
        saved
    }
    async fn wait_and_save(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        self.inner.wait_and_save(key, ttl).await
    }
    async fn wait_and_save_read(&self, key: &Key, ttl: Option<Duration>) -> Result<Saved> {
        self.inner.wait_and_save_read(key, ttl).await
    }
    async fn put_off_expiration(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        self.inner.put_off_expiration(key, ttl).await
    }
    async fn delete(&self, key: &Key) -> Result<bool> {
        self.inner.delete(key).await
    }
    async fn release_after(&self, key: &Key, after: Duration) -> Result<Option<Holding>> {
        self.inner.release_after(key, after).await
    }
    async fn exists(&self, key: &Key) -> Result<Holding> {
        self.inner.exists(key).await
    }
    async fn watch(&self, key: &Key, waiting_since: SystemTime) -> Result<Option<Watcher>> {
        let Some(watcher) = self.inner.watch(key, waiting_since).await? else {
            return Ok(None);
        };
        self.regs.watched(key);
        let hold = Watching(self.regs.clone(), key.clone());
        let covers = watcher.coverage();
        Ok(Some(Watcher::with_coverage(watcher, move || {
            let _ = &hold;
            covers()
        })))
    }
    async fn watch_loss(&self, key: &Key) -> Result<Option<LossWatcher>> {
        self.inner.watch_loss(key).await
    }
    async fn holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        self.inner.holders(resource).await
    }
    async fn usage(&self, key: &Key) -> Result<Usage> {
        self.inner.usage(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<Listing>> {
        self.inner.list(prefix).await
    }
    fn why_not_listing(&self) -> String {
        self.inner.why_not_listing()
    }
    async fn watch_changes(&self, resource: &str) -> Result<Option<Watcher>> {
        self.inner.watch_changes(resource).await
    }
    fn why_not_counting(&self) -> String {
        self.inner.why_not_counting()
    }
    async fn fencing_counter(&self, resource: &str) -> Result<Option<u64>> {
        self.inner.fencing_counter(resource).await
    }
    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
    async fn check(&self) -> Result<Vec<StoreWarning>> {
        self.inner.check().await
    }
    #[cfg(unix)]
    fn inheritable_descriptors(&self, key: &Key) -> Result<Option<Vec<std::os::fd::OwnedFd>>> {
        self.inner.inheritable_descriptors(key)
    }
    fn locks_in(&self) -> Option<String> {
        self.inner.locks_in()
    }
    fn location(&self, resource: &str) -> Option<String> {
        self.inner.location(resource)
    }
    fn lease_remaining(&self, key: &Key) -> Option<Duration> {
        self.inner.lease_remaining(key)
    }
    fn unsupported(&self, key: &Key, what: &str) -> Error {
        self.inner.unsupported(key, what)
    }
}
