//! The blocking [`Election`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::rt::Rt;
use crate::election::{Leader, Leadership};
use crate::error::Result;
use crate::lock::lockable::Release;
use crate::lock::lost::LockLost;

/// A candidate in a leader election for code without an async runtime: the operations of
/// [`crate::Election`], blocking the calling thread. Clones are the same candidate.
///
/// Made by [`LockFactory::create_election`](super::LockFactory::create_election). Every
/// method refuses with [`Unsupported`](crate::ErrorKind::Unsupported) inside a tokio runtime.
///
/// ```
/// # fn main() -> xtr_lock::Result<()> {
/// use std::time::Duration;
/// let factory = xtr_lock::blocking::LockFactory::from_dsn("in-memory")?;
/// let (a, b) = (factory.create_election("cron"), factory.create_election("cron"));
/// let leading = a.campaign("host-a")?;
/// assert!(b.campaign_timeout("host-b", Duration::from_millis(50))?.is_none());
/// assert_eq!(b.leader()?.unwrap().value_lossy(), "host-a");
/// assert!(a.wait_lost(&leading, Duration::from_millis(1))?.is_none());
/// let _ = a.resign()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    pub(super) inner: Option<crate::Election>,
    pub(super) rt: Arc<Rt>,
}

impl Election {
    fn get(&self) -> &crate::Election {
        self.inner.as_ref().expect("present until dropped")
    }

    /// The async candidate behind it.
    pub fn as_async(&self) -> &crate::Election {
        self.get()
    }

    /// Campaigns again after a loss, as [`crate::Election::set_recampaign`].
    pub fn set_recampaign(&self, on: bool) {
        self.get().set_recampaign(on);
    }

    /// Waits until this candidate leads, as [`crate::Election::campaign`].
    ///
    /// # Errors
    ///
    /// As [`crate::Election::campaign`]; `Unsupported` inside a tokio runtime.
    pub fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Leadership> {
        self.rt.run(self.get().campaign(value))?
    }

    /// Campaigns for at most `wait`: `None` when another still leads then (the campaign is
    /// withdrawn and holds nothing).
    ///
    /// # Errors
    ///
    /// As [`campaign`](Self::campaign).
    pub fn campaign_timeout(
        &self,
        value: impl Into<Vec<u8>>,
        wait: Duration,
    ) -> Result<Option<Leadership>> {
        let campaign = self.get().campaign(value);
        match self
            .rt
            .run(async { tokio::time::timeout(wait, campaign).await })?
        {
            Ok(led) => led.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Stops leading, as [`crate::Election::resign`].
    ///
    /// # Errors
    ///
    /// As [`crate::Election::resign`]; `Unsupported` inside a tokio runtime.
    pub fn resign(&self) -> Result<Release> {
        self.rt.run(self.get().resign())?
    }

    /// Whether this candidate leads now.
    pub fn is_leader(&self) -> bool {
        *self.get().is_leader().borrow()
    }

    /// This candidate's leadership, if it leads.
    pub fn leadership(&self) -> Option<Leadership> {
        self.get().leadership()
    }

    /// Who leads now, as [`crate::Election::leader`].
    ///
    /// # Errors
    ///
    /// As [`crate::Election::leader`]; `Unsupported` inside a tokio runtime.
    pub fn leader(&self) -> Result<Option<Leader>> {
        self.rt.run(self.get().leader())?
    }

    /// Waits at most `wait` for `leadership` to be lost: the loss, or `None` if it still
    /// stands.
    ///
    /// # Errors
    ///
    /// `Unsupported` inside a tokio runtime.
    pub fn wait_lost(&self, leadership: &Leadership, wait: Duration) -> Result<Option<LockLost>> {
        Ok(self
            .rt
            .run(async { tokio::time::timeout(wait, leadership.lost()).await })?
            .ok())
    }

    /// Waits at most `wait` for the leader to change from `last` (`None`: nobody leads): the
    /// new leader (`Ok(Some(new))`, where `new` is `None` when nobody leads now), or `Ok(None)`
    /// if it did not change in time.
    ///
    /// # Errors
    ///
    /// A store failure; `Unsupported` inside a tokio runtime.
    pub fn wait_change(
        &self,
        last: Option<&Leader>,
        wait: Duration,
    ) -> Result<Option<Option<Leader>>> {
        let mut observer = self.get().observe();
        let changed = async {
            loop {
                let now = observer.next().await?;
                let same = match (last, &now) {
                    (Some(a), Some(b)) => a.same_as(b),
                    (a, b) => a.is_none() && b.is_none(),
                };
                if !same {
                    return Ok::<_, crate::Error>(now);
                }
            }
        };
        match self
            .rt
            .run(async { tokio::time::timeout(wait, changed).await })?
        {
            Ok(now) => now.map(Some),
            Err(_) => Ok(None),
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        // The last clone's drop lets the lock go in the background, on our runtime.
        if let Some(inner) = self.inner.take() {
            self.rt.enter(|| drop(inner));
        }
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.get(), f)
    }
}
