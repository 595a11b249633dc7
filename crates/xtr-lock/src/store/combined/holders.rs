//! Introspection over a quorum: the holders that members enough agree on.

use std::collections::BTreeMap;

use futures_util::future::join_all;

use super::CombinedStore;
use crate::error::{Error, Result};
use crate::key::Mode;
use crate::logging::TARGET;
use crate::store::{HolderInfo, Listing};

/// A semaphore's limit (`None` for a lock) and each member's holders of one resource.
type Members = (Option<u32>, Vec<Vec<HolderInfo>>);

impl CombinedStore {
    /// The holders that members enough to meet the strategy report, told apart by
    /// [`HolderInfo::id`] (stores of one kind agree on it), else by pid; a holder is in write
    /// mode when members enough say so, and its remaining lifetime is the shortest any of them
    /// reports. A holder seen by too few members is left out, even where the members that did
    /// not answer might have made up the quorum. Holders are matched across members by id or
    /// pid, so a quorum without a majority of one kind (flock, Redis and in-memory members
    /// together: their tokens differ and only flock gives pids) cannot match its holders and
    /// lists none.
    ///
    /// # Errors
    ///
    /// A temporary storage error when too few members could answer to speak for the quorum.
    pub(super) async fn quorum_holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let n = self.stores.len();
        let answers = join_all(self.stores.iter().map(|store| async move {
            if !store.capabilities().introspection {
                return None;
            }
            store
                .holders(resource)
                .await
                .inspect_err(|err| {
                    tracing::debug!(target: TARGET, resource, store = %store, error = %err,
                        "one store failed to tell who holds the lock");
                })
                .ok()
        }))
        .await;
        let answered = answers.iter().flatten().count();
        if !self.strategy.is_met(answered, n) {
            return Err(Error::storage(format!(
                "only {answered} of {n} stores could tell who holds the lock: too few to speak \
                 for the quorum"
            ))
            .with_resource(resource)
            .with_store(self)
            .temporary());
        }
        Ok(self.merge(answers.into_iter().flatten()))
    }

    /// When the quorum was complete, of the members' acquisition times: the time of the member
    /// that made it a quorum (the second earliest of three), which members whose record lands
    /// later do not change (the latest of them would, from one look to the next).
    fn quorum_time(
        &self,
        times: impl Iterator<Item = std::time::SystemTime>,
    ) -> Option<std::time::SystemTime> {
        let n = self.stores.len();
        let mut times: Vec<_> = times.collect();
        times.sort_unstable();
        let needed = (1..=n).find(|k| self.strategy.is_met(*k, n)).unwrap_or(n);
        times.get(needed.min(times.len()).checked_sub(1)?).copied()
    }

    /// The holders that members enough report, merged (see [`quorum_holders`]): each with the
    /// metadata the first member with a record shows (a key carries one value to every member),
    /// the time the quorum was complete of the members' acquisition times (see
    /// [`quorum_time`](CombinedStore::quorum_time)) and no fencing token (members count on
    /// their own; a quorum does not fence).
    ///
    /// [`quorum_holders`]: CombinedStore::quorum_holders
    pub(super) fn merge(&self, answers: impl Iterator<Item = Vec<HolderInfo>>) -> Vec<HolderInfo> {
        let n = self.stores.len();
        #[derive(Clone, PartialEq)]
        enum Who {
            Id(String),
            Pid(u32),
            Unknown(Mode),
        }
        let mut groups: Vec<(Who, Vec<HolderInfo>)> = Vec::new();
        for list in answers {
            let mut here: Vec<Who> = Vec::new();
            for holder in list.into_iter().filter(|h| !h.waiting) {
                let who = match (&holder.id, holder.pid) {
                    (Some(id), _) => Who::Id(id.clone()),
                    (None, Some(pid)) => Who::Pid(pid),
                    (None, None) => Who::Unknown(holder.mode),
                };
                if here.contains(&who) {
                    continue; // one vote per member
                }
                match groups.iter_mut().find(|(w, _)| *w == who) {
                    Some((_, seen)) => seen.push(holder),
                    None => groups.push((who.clone(), vec![holder])),
                }
                here.push(who);
            }
        }
        groups
            .into_iter()
            .filter(|(_, seen)| self.strategy.is_met(seen.len(), n))
            .map(|(who, seen)| {
                let writes = seen.iter().filter(|h| h.mode == Mode::Write).count();
                let mode = if self.strategy.is_met(writes, n) {
                    Mode::Write
                } else {
                    Mode::Read
                };
                let pid = seen[0]
                    .pid
                    .filter(|p| seen.iter().all(|h| h.pid == Some(*p)));
                let mut holder =
                    HolderInfo::new(mode, pid, seen.iter().filter_map(|h| h.remaining).min());
                if let Who::Id(id) = who {
                    holder.id = Some(id);
                }
                holder.meta = seen.iter().find_map(|h| h.meta.clone());
                holder.acquired_at = self.quorum_time(seen.iter().filter_map(|h| h.acquired_at));
                holder.permits = seen[0]
                    .permits
                    .filter(|p| seen.iter().all(|h| h.permits == Some(*p)));
                holder
            })
            .collect()
    }

    /// Every resource under `prefix` that members enough to meet the strategy list as held by
    /// the same holders: the members' listings merged per resource (locks and semaphores
    /// apart) as [`merge`](CombinedStore::merge) merges holders, so a resource held on a quorum
    /// of members is listed, one held on too few (an acquisition under way, or one that failed
    /// and is being taken back) is not. Waiters are not listed (members queue them apart).
    ///
    /// # Errors
    ///
    /// A temporary storage error when too few members could list to speak for the quorum.
    pub(super) async fn quorum_list(&self, prefix: &str) -> Result<Vec<Listing>> {
        let n = self.stores.len();
        let answers = join_all(self.stores.iter().map(|store| async move {
            store
                .list(prefix)
                .await
                .inspect_err(|err| {
                    tracing::debug!(target: TARGET, prefix, store = %store, error = %err,
                        "one store failed to list its locks");
                })
                .ok()
        }))
        .await;
        let answered = answers.iter().flatten().count();
        if !self.strategy.is_met(answered, n) {
            return Err(Error::storage(format!(
                "only {answered} of {n} stores could list their locks: too few to speak for \
                 the quorum"
            ))
            .with_store(self)
            .temporary());
        }
        // Per (resource, whether a semaphore): its limit and each member's holders.
        let mut by_resource: BTreeMap<(String, bool), Members> = BTreeMap::new();
        for listing in answers.into_iter().flatten().flatten() {
            let entry = by_resource
                .entry((listing.resource, listing.semaphore.is_some()))
                .or_insert_with(|| (listing.semaphore, Vec::new()));
            entry.1.push(listing.holders);
        }
        Ok(by_resource
            .into_iter()
            .map(|((resource, _), (semaphore, lists))| {
                let holders = self.merge(lists.into_iter());
                Listing {
                    resource,
                    semaphore,
                    holders,
                }
            })
            .filter(Listing::is_held)
            .collect())
    }
}
