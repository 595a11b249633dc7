//! The locks a store's holders in this process hold, resource → token: a refusal that names
//! one of them came from a holder whose release wakes this store's waiters in-process.
//!
//! An entry goes when its holder releases or loses the lock (`forget`), and at the latest
//! with the holder's key: a lock dropped without a release leaves nothing here, so the map
//! never outgrows the keys alive in this process, however many resources come and go.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

type Map = Mutex<HashMap<String, String>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The map of one store.
#[derive(Default)]
pub(crate) struct Held(Arc<Map>);

/// A holder's entry, kept on its key (in the store's per-key state): dropped with the key, it
/// removes the entry if the entry is still its own.
pub(crate) struct Claim {
    map: Weak<Map>,
    id: String,
    token: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(map) = self.map.upgrade() {
            remove_if(&mut lock(&map), &self.id, &self.token);
        }
    }
}

fn remove_if(map: &mut HashMap<String, String>, id: &str, token: &str) -> bool {
    let ours = map.get(id).is_some_and(|t| t == token);
    if ours {
        map.remove(id);
    }
    ours
}

impl Held {
    /// Records `token` as the holder of `id`, tied to the holder's `slot` (one per key and
    /// store: a key holds one resource, with one token).
    pub(crate) fn hold(&self, slot: &Mutex<Option<Claim>>, id: &str, token: &str) {
        lock(&self.0).insert(id.to_owned(), token.to_owned());
        let mut slot = lock(slot);
        if slot.is_none() {
            *slot = Some(Claim {
                map: Arc::downgrade(&self.0),
                id: id.to_owned(),
                token: token.to_owned(),
            });
        }
    }

    /// Whether a holder of this store holds `id` with a token `matches` accepts.
    pub(crate) fn held_by(&self, id: &str, matches: impl FnOnce(&str) -> bool) -> bool {
        lock(&self.0).get(id).is_some_and(|t| matches(t))
    }

    /// Forgets `token` as the holder of `id` (released, lost or taken over); whether it was.
    pub(crate) fn forget(&self, id: &str, token: &str) -> bool {
        remove_if(&mut lock(&self.0), id, token)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_goes_with_its_holders_slot_or_when_forgotten() {
        let held = Held::default();
        let (a, b) = (Mutex::new(None), Mutex::new(None));
        held.hold(&a, "r", "t1");
        assert!(held.held_by("r", |t| t == "t1"));
        // Dropped without a release: the entry goes with the key's slot.
        drop(a);
        assert_eq!(held.len(), 0);

        held.hold(&b, "r", "t2");
        assert!(held.forget("r", "t2"));
        assert!(!held.forget("r", "t2"));
        // Held again by the same holder: one entry, still tied to its slot.
        held.hold(&b, "r", "t2");
        held.hold(&b, "r", "t2");
        assert_eq!(held.len(), 1);
        // Another holder took the resource over: the old slot leaves its entry alone.
        let c = Mutex::new(None);
        held.hold(&c, "r", "t3");
        drop(b);
        assert!(held.held_by("r", |t| t == "t3"));
        drop(c);
        assert_eq!(held.len(), 0);
    }

    #[test]
    fn many_resources_dropped_without_release_leave_nothing() {
        let held = Held::default();
        for i in 0..10_000 {
            let slot = Mutex::new(None);
            held.hold(&slot, &format!("r{i}"), "t");
        }
        assert_eq!(held.len(), 0);
    }

    #[test]
    fn a_claim_outliving_its_store_is_harmless() {
        let held = Held::default();
        let slot = Mutex::new(None);
        held.hold(&slot, "r", "t");
        drop(held);
        drop(slot);
    }
}
