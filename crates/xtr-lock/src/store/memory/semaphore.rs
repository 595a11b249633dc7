//! The in-memory store's counting semaphores: per name, the limit its holders use and each
//! holder's permits, apart from the locks of the same name.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::queue::{Queue, Want};
use super::{InMemoryStore, KIND};
use crate::error::{LostReason, Result};
use crate::key::{Key, Mode};
use crate::permits::Permits;
use crate::store::Usage;
use crate::store::{Acquired, Conflict, HolderInfo, HolderRecord, Holding, Listing, Saved};

/// One semaphore: the limit its holders use, and who holds how many permits.
pub(super) struct Sem {
    limit: u32,
    holders: HashMap<String, Permit>,
    /// Who waits, in order.
    pub(super) queue: Queue,
}

struct Permit {
    count: u32,
    expires: Option<Instant>,
    fence: u64,
    record: HolderRecord,
}

fn alive(expires: Option<Instant>, now: Instant) -> bool {
    expires.is_none_or(|e| e > now)
}

impl Sem {
    /// Drops expired holders; returns whether any went.
    fn prune(&mut self, now: Instant) -> bool {
        let before = self.holders.len();
        self.holders.retain(|_, p| alive(p.expires, now));
        self.holders.len() != before
    }

    /// Permits held (in `u64`: a sum of `u32` counts cannot overflow it).
    fn used(&self) -> u64 {
        self.holders.values().map(|p| u64::from(p.count)).sum()
    }

    /// When the first holder's permits expire, if any do.
    fn first_expiry(&self, now: Instant) -> Option<Duration> {
        self.holders
            .values()
            .filter_map(|p| p.expires)
            .min()
            .map(|e| e.saturating_duration_since(now))
    }

    /// Who holds permits at `now`, with how many each.
    fn holders(&self, now: Instant) -> Vec<HolderInfo> {
        let pid = Some(std::process::id());
        self.holders
            .iter()
            .filter(|(_, p)| alive(p.expires, now))
            .map(|(t, p)| {
                let left = p.expires.map(|e| e.saturating_duration_since(now));
                HolderInfo::new(Mode::Write, pid, left)
                    .with_token(t)
                    .with_permits(p.count)
                    .with_record(Some(p.record.clone()))
            })
            .collect()
    }

    /// Whether `token`, holding nothing, may take `count` permits past the waiters: only if
    /// they fit beside the permits every waiter before it asks for (nobody passes a head that
    /// waits for more than are free).
    fn admits(&self, token: &str, count: u32) -> bool {
        let ahead: u64 = self
            .queue
            .ahead(token)
            .iter()
            .map(|t| match t.want {
                Want::Permits(n) => u64::from(n),
                _ => u64::from(self.limit),
            })
            .sum();
        self.used() + ahead + u64::from(count) <= u64::from(self.limit)
    }

    /// Wakes the waiters at the head whose permits fit, in order, up to the first that does
    /// not.
    pub(super) fn serve(&self) {
        let mut used = self.used();
        for t in self.queue.tickets() {
            let n = match t.want {
                Want::Permits(n) => u64::from(n),
                _ => return,
            };
            // A waiter whose limit differs finds out by its save; an empty semaphore takes
            // any limit.
            if self.holders.is_empty() && used == 0 || used + n <= u64::from(self.limit) {
                t.wake();
                used += n;
            } else {
                return;
            }
        }
    }

    /// What `token` holds at `now`, or why not.
    fn holding(&self, token: &str, now: Instant) -> Holding {
        match self.holders.get(token) {
            Some(p) if alive(p.expires, now) => Holding::Held(Mode::Write),
            Some(_) => Holding::NotHeld(LostReason::Expired),
            None => Holding::NotHeld(LostReason::Removed),
        }
    }
}

/// The change channel of a key's resource: a semaphore's is apart from the lock's of the same
/// name (a lock named so would only share wake-ups, never state).
pub(super) fn channel(key: &Key) -> Cow<'_, str> {
    match key.permits() {
        Some(_) => Cow::Owned(format!("semaphore\0{}", key.resource())),
        None => Cow::Borrowed(key.resource()),
    }
}

impl InMemoryStore {
    pub(super) async fn save_permits(
        &self,
        key: &Key,
        permits: Permits,
        ttl: Option<Duration>,
    ) -> Result<Saved> {
        let token = key.token(KIND);
        self.reduce(key, ttl);
        let saved = {
            let (now, expires) = self.times(ttl);
            let mut guard = self.state();
            let st = &mut *guard;
            let sem = semaphore_entry(&mut st.semaphores, key.resource(), permits.limit());
            let pruned = sem.prune(now);
            if sem.holders.is_empty() {
                sem.limit = permits.limit();
            }
            let outcome = if sem.limit != permits.limit() {
                Err(permits.limit_mismatch(key.resource(), sem.limit))
            } else if let Some(p) = sem.holders.get_mut(&token) {
                if p.count == permits.count() {
                    p.expires = expires;
                    p.record.meta = key.meta().map(|m| m.to_vec());
                    Ok(Saved::Acquired(Acquired::fenced(p.fence)))
                } else {
                    Err(permits.count_changed(key.resource(), p.count))
                }
            } else if sem.admits(&token, permits.count()) {
                st.last_fence += 1;
                let fence = st.last_fence;
                let permit = Permit {
                    count: permits.count(),
                    expires,
                    fence,
                    record: HolderRecord::now(key).with_fencing_token(Some(fence)),
                };
                sem.queue.admitted(&token);
                sem.holders.insert(token, permit);
                Ok(Saved::Acquired(Acquired::fenced(fence)))
            } else {
                // Refused by the queue alone (no permit held): look again (see QUEUE_RECHECK).
                let conflict = Conflict::new();
                Ok(Saved::Conflict(match sem.first_expiry(now) {
                    Some(d) => conflict.with_retry_after(d),
                    None if sem.holders.is_empty() => {
                        conflict.with_retry_after(super::QUEUE_RECHECK)
                    }
                    None => conflict,
                }))
            };
            if pruned {
                sem.serve();
                st.notify(&channel(key));
            }
            st.tidy_semaphore(key.resource());
            outcome?
        };
        self.finish(key, saved).await
    }

    /// The caller has shortened the key's lifetime.
    pub(super) fn put_off_permits(&self, key: &Key, ttl: Duration) -> Holding {
        let token = key.token(KIND);
        let (now, expires) = self.times(Some(ttl));
        let mut st = self.state();
        let Some(sem) = st.semaphores.get_mut(key.resource()) else {
            return Holding::NotHeld(LostReason::Removed);
        };
        let holding = sem.holding(&token, now);
        let pruned = sem.prune(now);
        if let (Holding::Held(_), Some(p)) = (holding, sem.holders.get_mut(&token)) {
            p.expires = expires;
        }
        if pruned {
            sem.serve();
        }
        st.tidy_semaphore(key.resource());
        if pruned {
            st.notify(&channel(key));
        }
        holding
    }

    pub(super) fn delete_permits(&self, key: &Key) -> bool {
        let token = key.token(KIND);
        let (now, _) = self.times(None);
        let mut st = self.state();
        let Some(sem) = st.semaphores.get_mut(key.resource()) else {
            return false;
        };
        let pruned = sem.prune(now);
        let removed = sem.holders.remove(&token).is_some();
        if removed || pruned {
            sem.serve();
        }
        st.tidy_semaphore(key.resource());
        if removed || pruned {
            st.notify(&channel(key));
        }
        removed
    }

    pub(super) fn permits_holding(&self, key: &Key) -> Holding {
        if !key.has_token(KIND) {
            return Holding::NotHeld(LostReason::Removed);
        }
        let (now, _) = self.times(None);
        match self.state().semaphores.get(key.resource()) {
            Some(sem) => sem.holding(&key.token(KIND), now),
            None => Holding::NotHeld(LostReason::Removed),
        }
    }

    pub(super) fn usage_of(&self, key: &Key) -> Usage {
        let (now, _) = self.times(None);
        let st = self.state();
        let Some(sem) = st.semaphores.get(key.resource()) else {
            return Usage::default();
        };
        let holders = sem.holders(now);
        Usage {
            used: holders
                .iter()
                .filter_map(|h| h.permits)
                .map(u64::from)
                .sum::<u64>()
                .try_into()
                .unwrap_or(u32::MAX),
            limit: (!holders.is_empty()).then_some(sem.limit),
            holders,
        }
    }
}

/// The semaphores among `semaphores` whose names start with `prefix` and that somebody holds.
pub(super) fn listed<'a>(
    semaphores: &'a HashMap<String, Sem>,
    prefix: &'a str,
    now: Instant,
) -> impl Iterator<Item = Listing> + 'a {
    semaphores
        .iter()
        .filter(move |(name, _)| name.starts_with(prefix))
        .map(move |(name, sem)| {
            let mut holders = sem.holders(now);
            holders.extend(sem.queue.tickets().iter().map(|t| t.info()));
            Listing::semaphore(name.clone(), sem.limit, holders)
        })
        .filter(Listing::is_held)
}

impl super::State {
    /// The semaphore `resource`, made with `limit` if nobody holds or waits for it.
    pub(super) fn semaphore(&mut self, resource: &str, limit: u32) -> &mut Sem {
        semaphore_entry(&mut self.semaphores, resource, limit)
    }

    pub(super) fn tidy_semaphore(&mut self, resource: &str) {
        if self
            .semaphores
            .get(resource)
            .is_some_and(|s| s.holders.is_empty() && s.queue.is_empty())
        {
            self.semaphores.remove(resource);
        }
    }
}

/// The semaphore `resource`, made with `limit` if nobody holds or waits for it.
fn semaphore_entry<'a>(
    semaphores: &'a mut HashMap<String, Sem>,
    resource: &str,
    limit: u32,
) -> &'a mut Sem {
    semaphores
        .entry(resource.to_owned())
        .or_insert_with(|| Sem {
            limit,
            holders: HashMap::new(),
            queue: Queue::default(),
        })
}
