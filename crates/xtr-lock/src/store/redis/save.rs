//! A lock's save on Redis: the script for the mode, with the waiter's ticket when it waits, and
//! what its answer means (admitted with a fencing token, refused with when to look again and
//! what the holder keeps, a key that is not a lock, a write the replicas did not confirm).

use std::time::Duration;

use super::RedisStore;
use super::conn::Keys;
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::store::{Acquired, Conflict, Saved, check_expiry};

impl RedisStore {
    pub(super) fn ttl(&self, key: &Key, ttl: Option<Duration>) -> Result<Duration> {
        ttl.ok_or_else(|| {
            Error::invalid_argument(
                "a lock on Redis needs a ttl (there is no silent default): give the lock one",
            )
            .with_resource(key.resource())
            .with_store(self)
        })
    }

    pub(super) async fn save_mode(
        &self,
        key: &Key,
        ttl: Option<Duration>,
        mode: Mode,
    ) -> Result<Saved> {
        let ttl = self.ttl(key, ttl)?;
        self.settled(key).await;
        // The local deadline is never later than the server's: shortened before the trip.
        key.reduce_lifetime(ttl);
        let script = match mode {
            Mode::Write => &self.inner.scripts.save,
            Mode::Read => &self.inner.scripts.save_read,
        };
        let lock_key = self.key_for(key.resource());
        let allowed = self.grants_allowed(key);
        let grant_ttl = allowed.map(|yes| yes.then_some(ttl));
        let ticket = self.inner.notifier.ticket(&lock_key, key, mode, grant_ttl);
        // A release granted this waiter the lock: it holds without a trip of its own. Not when
        // the save must write what a grant cannot (metadata set since the ticket): the grant
        // then stays offered, for the server to re-save or its leaving to take back.
        let grantable = mode == Mode::Write && allowed == Some(true);
        if let Some(ticket) = ticket.as_ref().filter(|_| grantable) {
            let ttl_ms = super::grant::ttl_ms(ttl);
            if let Some((grant, ends)) = ticket.grants().take_in(key.clock().now(), ttl_ms) {
                key.reduce_deadline(ends);
                self.inner.notifier.answered(self, ticket, true, false);
                return self
                    .admitted(key, true, i64::try_from(grant.fence).unwrap_or(0))
                    .await;
            }
        }
        let call = self.call_for(
            key,
            Keys::Save,
            ticket.as_ref().map(|t| (t.text.as_str(), t.since_us)),
        );
        let sent = key.clock().now();
        let (reply, confirmed): (Vec<i64>, bool) =
            self.eval_durable(script, key, Some(ttl), call).await?;
        let at = |i: usize| reply.get(i).copied().unwrap_or(0);
        let (granted, value, kept, announced) = (at(0), at(1), at(2), at(3));
        if ticket.is_none() && granted == 1 {
            // A waiter's save sent without a ticket (its wake channel down) spends its grant.
            let fence = u64::try_from(value).unwrap_or(0);
            self.inner
                .notifier
                .admitted_unticketed(&lock_key, key, fence);
        }
        if let Some(ticket) = &ticket {
            match granted {
                1 => ticket.grants().admitted(u64::try_from(value).unwrap_or(0)),
                0 => ticket
                    .grants()
                    .refused(sent, u64::try_from(at(4)).unwrap_or(0)),
                _ => {}
            }
            self.inner
                .notifier
                .answered(self, ticket, granted == 1, announced == 1);
        }
        if granted == -1 {
            return Err(Error::storage(
                "the key holds a sorted set that is not a lock (members other than holder \
                 tokens): refused and left untouched",
            )
            .with_resource(key.resource())
            .with_store(self));
        }
        if granted != 1 {
            let conflict = Conflict::new().with_kept((kept == 1).then_some(Mode::Read));
            return Ok(Saved::Conflict(match u64::try_from(value) {
                Ok(ms) if ms > 0 => conflict.with_retry_after(Duration::from_millis(ms)),
                _ => conflict,
            }));
        }
        self.admitted(key, confirmed, value).await
    }

    /// Whether a release may grant `key`'s holder the lock while it waits (direct hand-off):
    /// on a fair store, on one server (not a cluster: a grant writes keys its script was not
    /// given), on the server's clock, without replicas to wait for (a grant is not confirmed by
    /// them), and for a holder without metadata (a grant cannot write it). `None` until the
    /// store knows which clock its scripts read.
    fn grants_allowed(&self, key: &Key) -> Option<bool> {
        let inner = &self.inner;
        let server_clock = !(*super::lock(&inner.client_clock))?;
        Some(
            server_clock
                && inner.fair
                && inner.durability.is_none()
                && !inner.layout.is_slotted()
                && key.meta().is_none(),
        )
    }

    /// An admitted save (a lock's or a semaphore's): counted once the replicas confirmed it
    /// (else the caller takes a fresh grant back; a holder that held before keeps what it held),
    /// with its fencing token (`value`, 0 for none).
    pub(super) async fn admitted(&self, key: &Key, confirmed: bool, value: i64) -> Result<Saved> {
        if !confirmed {
            return Err(self.unconfirmed(key));
        }
        check_expiry(self, key).await?;
        Ok(Saved::Acquired(match u64::try_from(value) {
            Ok(fence) if fence > 0 => Acquired::fenced(fence),
            _ => Acquired::new(),
        }))
    }
}
