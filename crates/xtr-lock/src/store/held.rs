//! The locks a store's holders in this process hold, resource → token: a refusal that names
//! one of them came from a holder whose release wakes this store's waiters in-process.
//!
//! An entry goes when its holder releases or loses the lock (`forget`), and at the latest
//! with the holder's key: a lock dropped without a release leaves nothing here, so the map
//! never outgrows the keys alive in this process, however many resources come and go.

use crate::mutex::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The lifetime, in whole seconds, that keeps a lock of a store that counts whole seconds and
/// may end it up to 1 s early (its clock quantised: SQL's table, Memcached) for at least
/// `after` from now: rounded up, plus the second it may end early (at least 2, as a renewal
/// of those stores needs).
pub(crate) fn release_secs(after: Duration) -> u64 {
    crate::clock::seconds_up(after).saturating_add(1).max(2)
}

/// One resource's entry: its holder's token, and how many keys claim it (clones share a claim;
/// a key deserialized in this process holds the same token with a claim of its own).
struct Entry {
    token: String,
    /// Tells this entry from an earlier one of the same token that was forgotten: a claim on
    /// the earlier one must not count against this one.
    generation: u64,
    claims: usize,
}

#[derive(Default)]
struct Map {
    entries: HashMap<String, Entry>,
    generations: u64,
}

/// The map of one store.
#[derive(Default)]
pub(crate) struct Held(Arc<Mutex<Map>>);

/// A holder's claim on its entry, kept on its key (in the store's per-key state): dropped with
/// the key, it removes the entry once no other key claims it.
pub(crate) struct Claim {
    map: Weak<Mutex<Map>>,
    id: String,
    generation: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let Some(map) = self.map.upgrade() else {
            return;
        };
        let mut map = lock(&map);
        let Some(entry) = map.entries.get_mut(&self.id) else {
            return;
        };
        if entry.generation == self.generation {
            entry.claims -= 1;
            if entry.claims == 0 {
                map.entries.remove(&self.id);
            }
        }
    }
}

impl Held {
    /// Records `token` as the holder of `id`, tied to the holder's `slot` (one per key and
    /// store: a key holds one resource, with one token).
    pub(crate) fn hold(&self, slot: &Mutex<Option<Claim>>, id: &str, token: &str) {
        let mut map = lock(&self.0);
        let mut slot = lock(slot);
        let current = map
            .entries
            .get(id)
            .filter(|e| e.token == token)
            .map(|e| e.generation);
        if let (Some(claim), Some(generation)) = (slot.as_ref(), current)
            && claim.generation == generation
        {
            return;
        }
        let generation = match current {
            Some(generation) => generation,
            None => {
                map.generations += 1;
                let generation = map.generations;
                let entry = Entry {
                    token: token.to_owned(),
                    generation,
                    claims: 0,
                };
                map.entries.insert(id.to_owned(), entry);
                generation
            }
        };
        if let Some(entry) = map.entries.get_mut(id) {
            entry.claims += 1;
        }
        let claim = Claim {
            map: Arc::downgrade(&self.0),
            id: id.to_owned(),
            generation,
        };
        // The slot's old claim (on a forgotten entry) lets go after the map's lock.
        let old = slot.replace(claim);
        drop((slot, map));
        drop(old);
    }

    /// Whether a holder of this store holds `id` with a token `matches` accepts.
    pub(crate) fn held_by(&self, id: &str, matches: impl FnOnce(&str) -> bool) -> bool {
        lock(&self.0)
            .entries
            .get(id)
            .is_some_and(|e| matches(&e.token))
    }

    /// Forgets `token` as the holder of `id` (released, lost or taken over), for every key
    /// that claims it; whether it was.
    pub(crate) fn forget(&self, id: &str, token: &str) -> bool {
        let mut map = lock(&self.0);
        let ours = map.entries.get(id).is_some_and(|e| e.token == token);
        if ours {
            map.entries.remove(id);
        }
        ours
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.0).entries.len()
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
    fn two_keys_of_one_token_keep_the_entry_until_both_go() {
        let held = Held::default();
        let (a, b) = (Mutex::new(None), Mutex::new(None));
        held.hold(&a, "r", "t");
        held.hold(&b, "r", "t");
        held.hold(&b, "r", "t");
        drop(a);
        assert!(held.held_by("r", |t| t == "t"), "the other key still holds");
        drop(b);
        assert_eq!(held.len(), 0);

        // A claim on a forgotten entry does not count against a newer one of the same token.
        let (c, d) = (Mutex::new(None), Mutex::new(None));
        held.hold(&c, "r", "t");
        assert!(held.forget("r", "t"));
        held.hold(&d, "r", "t");
        drop(c);
        assert!(held.held_by("r", |t| t == "t"));
        drop(d);
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

#[cfg(test)]
mod release_tests {
    use super::release_secs;
    use std::time::Duration;

    #[test]
    fn a_release_later_rounds_up_and_covers_the_early_second() {
        assert_eq!(release_secs(Duration::from_secs(2)), 3);
        assert_eq!(release_secs(Duration::from_millis(1500)), 3);
        assert_eq!(release_secs(Duration::from_millis(1)), 2);
        assert_eq!(release_secs(Duration::ZERO), 2);
        assert_eq!(release_secs(Duration::MAX), u64::MAX);
    }
}
