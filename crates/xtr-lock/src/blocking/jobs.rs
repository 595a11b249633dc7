//! The blocking forms of the job policies: hold limits, revocation, overlap policies.

use std::time::Duration;

use super::Lock;
use crate::error::Result;
use crate::key::Mode;
use crate::lock::lockable::Wait;
use crate::lock::policy::OnConflict;
use crate::lock::revoke::Revocation;

impl Lock {
    /// Held at least `min` from each acquisition; as [`crate::Lock::with_min_hold`] (a release
    /// on a store whose locks die with their holder blocks until then).
    #[must_use]
    pub fn with_min_hold(mut self, min: Duration) -> Self {
        self.inner = self.inner.with_min_hold(min);
        self
    }

    /// Held at most `max` from each acquisition by guards and scopes; as
    /// [`crate::Lock::with_max_hold`].
    #[must_use]
    pub fn with_max_hold(mut self, max: Duration) -> Self {
        self.inner = self.inner.with_max_hold(max);
        self
    }

    /// Renewed at most `renewals` times per acquisition; as
    /// [`crate::Lock::with_max_renewals`].
    #[must_use]
    pub fn with_max_renewals(mut self, renewals: u32) -> Self {
        self.inner = self.inner.with_max_renewals(renewals);
        self
    }

    /// Takes the lock as `on_conflict` says when someone else holds it; as
    /// [`crate::Lock::acquire_with_policy`].
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::acquire_with_policy`]; `Unsupported` inside a tokio runtime.
    pub fn acquire_with_policy(
        &self,
        mode: Mode,
        wait: Wait,
        on_conflict: OnConflict,
    ) -> Result<bool> {
        self.rt
            .run(self.inner.acquire_with_policy(mode, wait, on_conflict))?
    }

    /// Asks every holder to give the lock up and waits up to `wait` for them to; as
    /// [`crate::Lock::revoke`].
    ///
    /// # Errors
    ///
    /// As [`crate::Lock::revoke`]; `Unsupported` inside a tokio runtime.
    pub fn revoke(&self, wait: Duration) -> Result<Revocation> {
        self.rt.run(self.inner.revoke(wait))?
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::blocking::LockFactory;
    use crate::store::InMemoryStore;

    #[test]
    fn the_job_policies_block() {
        let factory = LockFactory::with_store(|| Ok(InMemoryStore::new())).unwrap();
        let min = Duration::from_millis(300);
        let a = factory.create_lock("job").with_min_hold(min);
        let started = Instant::now();
        assert!(a.try_acquire().unwrap());
        assert!(a.release().unwrap().was_held());
        assert!(started.elapsed() >= min, "a lock of this process holds on");
        let b = factory.create_lock("job");
        assert!(b.try_acquire().unwrap());
        let c = factory.create_lock("job");
        let queued = c.acquire_with_policy(Mode::Write, Wait::Never, OnConflict::QueueOne);
        assert!(!queued.unwrap(), "never waits");
        let revoked = c.revoke(Duration::from_millis(50)).unwrap();
        assert_eq!(
            (revoked.asked, revoked.let_go),
            (1, false),
            "b does not listen"
        );
        assert!(b.release().unwrap().was_held());
    }
}
