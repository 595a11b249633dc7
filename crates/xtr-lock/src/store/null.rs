//! [`NullStore`]: a store that locks nothing.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::{Acquired, Capabilities, Holding, Saved, Store};
use crate::error::{LostReason, Result};
use crate::key::{Key, Mode};

/// A store that locks nothing: every save and wait succeeds at once for every holder, put-off
/// succeeds and delete does nothing, and [`exists`](Store::exists) always says "not held".
///
/// For turning locking off by configuration (`null` DSN) while keeping the code that locks.
///
/// A [`Lock`](crate::Lock) on it therefore acquires (`true`, blocking too) but
/// [`is_acquired`](crate::Lockable::is_acquired) answers `false`; it is never lost, and its
/// release always says [`Released`](crate::Release::Released). This asymmetry with [`NoLock`](crate::NoLock), whose `is_acquired` is `true`, is the
/// Python peer's, kept on purpose: `NoLock` pretends to be a held lock, `NullStore` is a store
/// that holds nothing.
///
/// # Guarantees
///
/// None: it excludes no one.
///
/// # Failure modes
///
/// None.
///
/// # Clock assumptions
///
/// None: nothing expires.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullStore;

impl NullStore {
    /// The null store.
    pub fn new() -> Self {
        NullStore
    }
}

impl fmt::Display for NullStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("null")
    }
}

#[async_trait]
impl Store for NullStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            excludes: false,
            shared: true,
            blocking: true,
            blocking_shared: true,
            expiring: false,
            fencing: false,
            notifies: false,
            serializable_keys: true,
            introspection: false,
            liveness: false,
            observes_loss: false,
            leased: false,
            counting: true,
            metadata: false,
            lists: false,
            fair: false,
        }
    }

    async fn save(&self, _key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        Ok(Saved::Acquired(Acquired::new()))
    }

    /// Nobody holds anything.
    async fn usage(&self, _key: &Key) -> Result<crate::store::Usage> {
        Ok(crate::store::Usage::default())
    }

    async fn save_read(&self, _key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        Ok(Saved::Acquired(Acquired::new()))
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: completes at once and does nothing.
    async fn wait_and_save(&self, _key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        Ok(Saved::Acquired(Acquired::new()))
    }

    /// # Cancel safety
    ///
    /// Cancel-safe: completes at once and does nothing.
    async fn wait_and_save_read(&self, _key: &Key, _ttl: Option<Duration>) -> Result<Saved> {
        Ok(Saved::Acquired(Acquired::new()))
    }

    async fn put_off_expiration(&self, _key: &Key, _ttl: Duration) -> Result<Holding> {
        Ok(Holding::Held(Mode::Write))
    }

    async fn delete(&self, _key: &Key) -> Result<bool> {
        Ok(false)
    }

    async fn exists(&self, _key: &Key) -> Result<Holding> {
        Ok(Holding::NotHeld(LostReason::Removed))
    }
}
