//! Introspection over a quorum: the holders that members enough agree on.

use futures_util::future::join_all;

use super::CombinedStore;
use crate::error::{Error, Result};
use crate::key::Mode;
use crate::logging::TARGET;
use crate::store::HolderInfo;

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
        #[derive(Clone, PartialEq)]
        enum Who {
            Id(String),
            Pid(u32),
            Unknown(Mode),
        }
        let mut groups: Vec<(Who, Vec<HolderInfo>)> = Vec::new();
        for list in answers.into_iter().flatten() {
            let mut here: Vec<Who> = Vec::new();
            for holder in list {
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
        Ok(groups
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
                holder
            })
            .collect())
    }
}
