//! What introspection makes of the keys it read: a lock's queue and a semaphore's as
//! [`HolderInfo`]s (with their records), and the keys under a prefix grouped by resource. Pure:
//! the requests are in `introspect.rs`, every rule is unit-tested here.
//!
//! - A holder's metadata is a writer's value when it has one (ours, and a peer's: `etcdctl
//!   elect`'s proposal, which Go's `Proclaim` rewrites in place), else its record's. Its time
//!   of acquisition is its record's (peers have none).
//! - A holder's fencing token is its record's (the one it says, else the revision it was put
//!   at: the read that granted); a peer's is its key's create revision, the revision from
//!   which Go's election counts its leader (`etcdctl lock`'s `ETCD_LOCK_REV` may be later,
//!   when it waited). Waiters have none, and no time of acquisition.
//! - Listing: a lock's key is `<prefix><resource>/<name>`, its resource everything before the
//!   last `/`; only keys in the recipe's form are taken (on a lease, named for it:
//!   `<lease hex>`, or ours `r-`/`w-<lease hex>`), so application data that merely has a `/`
//!   in its name is not listed as a lock. Semaphores sit under `xtr-semaphore/`, records under
//!   `xtr-meta/`: never listed as locks.

use std::collections::{BTreeMap, HashMap};

use etcd_client::KeyValue;

use super::queue::{self, Entry, Kind};
use super::record::{self, Stored};
use super::semaphore;
use crate::key::Mode;
use crate::store::HolderInfo;

/// One key as read, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Kv {
    pub(super) key: Vec<u8>,
    pub(super) value: Vec<u8>,
    pub(super) create: i64,
    pub(super) modified: i64,
    pub(super) lease: i64,
}

impl From<&KeyValue> for Kv {
    fn from(kv: &KeyValue) -> Self {
        Kv {
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            create: kv.create_revision(),
            modified: kv.mod_revision(),
            lease: kv.lease(),
        }
    }
}

/// Records by the queue key each describes.
pub(super) type Records = HashMap<Vec<u8>, Stored>;

/// The records among `kvs`.
pub(super) fn records(prefix: &str, kvs: &[Kv]) -> Records {
    kvs.iter()
        .filter_map(|kv| {
            let queue_key = record::described(prefix, &kv.key)?;
            let record = crate::meta::HolderRecord::decode(&kv.value)?;
            Some((
                queue_key,
                Stored {
                    record,
                    mod_rev: kv.modified,
                },
            ))
        })
        .collect()
}

/// The queue of `dir` in `kvs`, each entry with its key's value.
fn queue_of<'a>(dir: &[u8], kvs: &'a [Kv]) -> Vec<(Entry, &'a [u8])> {
    let values: HashMap<&[u8], &[u8]> = kvs
        .iter()
        .map(|kv| (kv.key.as_slice(), kv.value.as_slice()))
        .collect();
    queue::entries(
        dir,
        kvs.iter()
            .map(|kv| (kv.key.as_slice(), kv.value.as_slice(), kv.create, kv.lease)),
    )
    .into_iter()
    .map(|e| {
        let value = values.get(e.key.as_slice()).copied().unwrap_or_default();
        (e, value)
    })
    .collect()
}

/// What `entry`'s record says, if it has one written since the key was (an older one is not
/// this key's).
fn record_of<'a>(entry: &Entry, records: &'a Records) -> Option<&'a Stored> {
    records.get(&entry.key).filter(|s| s.mod_rev >= entry.rev)
}

/// One queue entry as shown: `holds` or waits; `remaining` is filled in later.
fn info(mode: Mode, entry: &Entry, holds: bool, stored: Option<&Stored>) -> HolderInfo {
    // A holder of ours whose record is still a waiter's has not seen its grant (its
    // predecessor just went): shown waiting until the read that grants it writes its record,
    // so its token is known the moment it is shown holding.
    let holds = holds && !stored.is_some_and(|s| record::pending(&s.record));
    let mut info = HolderInfo::new(mode, None, None).with_record(stored.map(|s| s.record.clone()));
    if holds {
        let token = stored
            .and_then(Stored::token)
            .or_else(|| u64::try_from(entry.rev).ok());
        info.fencing_token = token;
    } else {
        info.fencing_token = None;
        info.acquired_at = None;
        info = info.queued();
    }
    info
}

/// A lock's queue in order, holders then waiters (each with its lease, for its time left).
pub(super) fn lock_holders(dir: &[u8], kvs: &[Kv], records: &Records) -> Vec<(HolderInfo, i64)> {
    let queue = queue_of(dir, kvs);
    let entries: Vec<Entry> = queue.iter().map(|(e, _)| e.clone()).collect();
    let holding = queue::holding(&entries);
    queue
        .iter()
        .zip(holding)
        .map(|((entry, value), holds)| {
            let name = &entry.key[dir.len()..];
            let mode = match entry.kind {
                Kind::Reader => Mode::Read,
                Kind::Writer => Mode::Write,
            };
            let mut backend = format!("lease {:x}", entry.lease);
            if !recipe_name(name, entry.lease) {
                backend.push_str(&format!(", key {}", String::from_utf8_lossy(name)));
            }
            backend.push_str(&format!(", queued at revision {}", entry.rev));
            let mut shown =
                info(mode, entry, holds, record_of(entry, records)).with_backend(backend);
            if entry.kind == Kind::Writer && !value.is_empty() {
                shown.meta = Some(value.to_vec());
            }
            (shown, entry.lease)
        })
        .collect()
}

/// A semaphore's queue in order, holders then waiters, and the limit its keys say (the
/// first's: a holder of another limit is refused). Its tokens are its keys' create revisions.
pub(super) fn semaphore_holders(
    dir: &[u8],
    kvs: &[Kv],
    records: &Records,
    limit: Option<u32>,
) -> (Option<u32>, Vec<(HolderInfo, i64)>) {
    let entries: Vec<Entry> = queue_of(dir, kvs).into_iter().map(|(e, _)| e).collect();
    let stored = entries.iter().find_map(|e| e.permits).map(|p| p.limit());
    let Some(limit) = stored.or(limit) else {
        return (None, Vec::new());
    };
    let shown = entries
        .iter()
        .zip(semaphore::holding(&entries, limit))
        .map(|(entry, holds)| {
            let mut shown = info(Mode::Write, entry, holds, record_of(entry, records))
                .with_backend(format!(
                    "lease {:x}, queued at revision {}",
                    entry.lease, entry.rev
                ))
                .with_permits(semaphore::weight(entry, limit));
            if holds {
                shown.fencing_token = u64::try_from(entry.rev).ok();
            }
            (shown, entry.lease)
        })
        .collect();
    (stored, shown)
}

/// Whether `name` is a queue key's name in the recipe's form for `lease`.
fn recipe_name(name: &[u8], lease: i64) -> bool {
    if lease == 0 {
        return false;
    }
    let hex = format!("{lease:x}");
    let bare = name
        .strip_prefix(b"r-")
        .or_else(|| name.strip_prefix(b"w-"))
        .unwrap_or(name);
    bare == hex.as_bytes()
}

/// The keys under one prefix, grouped: each lock's and each semaphore's directory (by
/// resource) with its keys, and every record.
#[derive(Debug, Default)]
pub(super) struct Grouped {
    pub(super) locks: BTreeMap<String, Vec<Kv>>,
    pub(super) semaphores: BTreeMap<String, Vec<Kv>>,
    pub(super) records: Vec<Kv>,
}

/// Groups `kvs` (read under the store's `prefix`) by the resource each belongs to, keeping
/// those whose name starts with `wanted`.
pub(super) fn group(prefix: &str, wanted: &str, kvs: Vec<Kv>) -> Grouped {
    let mut out = Grouped::default();
    let sem_ns = format!("{prefix}{}", semaphore::NAMESPACE);
    let rec_ns = format!("{prefix}{}", record::NAMESPACE);
    for kv in kvs {
        if kv.key.starts_with(rec_ns.as_bytes()) {
            out.records.push(kv);
        } else if let Some(rest) = kv.key.strip_prefix(sem_ns.as_bytes()) {
            let Some((enc, name)) = split_last(rest) else {
                continue;
            };
            let resource = semaphore::decode(&String::from_utf8_lossy(enc));
            if !enc.contains(&b'/') && !name.is_empty() && resource.starts_with(wanted) {
                out.semaphores.entry(resource).or_default().push(kv);
            }
        } else if let Some(rest) = kv.key.strip_prefix(prefix.as_bytes()) {
            let Some((resource, name)) = split_last(rest) else {
                continue;
            };
            let Ok(resource) = std::str::from_utf8(resource) else {
                continue;
            };
            if !resource.is_empty() && resource.starts_with(wanted) && recipe_name(name, kv.lease) {
                out.locks.entry(resource.to_owned()).or_default().push(kv);
            }
        }
    }
    out
}

/// `key` split at its last `/`.
fn split_last(key: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = key.iter().rposition(|b| *b == b'/')?;
    Some((&key[..at], &key[at + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::HolderRecord;
    use std::time::{Duration, UNIX_EPOCH};

    fn kv(key: &str, value: &[u8], create: i64, modified: i64, lease: i64) -> Kv {
        Kv {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            create,
            modified,
            lease,
        }
    }

    fn rec(meta: Option<&[u8]>, fence: Option<u64>) -> Vec<u8> {
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        HolderRecord::new(meta.map(<[u8]>::to_vec), at)
            .with_fencing_token(fence)
            .encode()
            .into_bytes()
    }

    #[test]
    fn a_writers_value_is_its_meta_readers_and_times_come_from_records() {
        let kvs = [
            kv("job/a", b"P1", 10, 10, 0xa),
            kv("job/r-b", b"read", 12, 12, 0xb),
            kv("job/c", b"", 13, 13, 0xc),
            kv("xtr-meta/job/a", &rec(Some(b"old"), None), 10, 14, 0xa),
            kv(
                "xtr-meta/job/r-b",
                &rec(Some(b"reader b"), None),
                12,
                12,
                0xb,
            ),
            kv("xtr-meta/job/c", &rec(None, None), 13, 15, 0xc),
        ];
        let records = records("", &kvs);
        let shown = lock_holders(b"job/", &kvs, &records);
        let (a, b, c) = (&shown[0].0, &shown[1].0, &shown[2].0);
        assert_eq!(a.meta.as_deref(), Some(&b"P1"[..]), "the value wins: {a:?}");
        assert_eq!(a.fencing_token, Some(14), "the grant's read: {a:?}");
        assert!(a.acquired_at.is_some() && !a.waiting);
        assert_eq!(b.meta.as_deref(), Some(&b"reader b"[..]));
        assert!(b.waiting && b.fencing_token.is_none() && b.acquired_at.is_none());
        assert!(c.waiting && c.meta.is_none());
        assert_eq!(shown[1].1, 0xb);
        // First in the queue, but its holder has not seen the grant yet: still waiting.
        let kvs = [
            kv("job/c", b"P3", 13, 13, 0xc),
            kv(
                "xtr-meta/job/c",
                &rec(None, Some(record::PENDING)),
                13,
                13,
                0xc,
            ),
        ];
        let pending = super::records("", &kvs);
        let c = &lock_holders(b"job/", &kvs, &pending)[0].0;
        assert!(c.waiting && c.fencing_token.is_none(), "{c:?}");
        assert_eq!(c.meta.as_deref(), Some(&b"P3"[..]));
    }

    #[test]
    fn peers_show_their_value_and_create_revision() {
        // `etcdctl elect job P1`: a key named for its lease, its proposal the value.
        let kvs = [kv("job/694d", b"P1", 7, 9, 0x694d)];
        let shown = lock_holders(b"job/", &kvs, &Records::new());
        let h = &shown[0].0;
        assert_eq!(h.meta.as_deref(), Some(&b"P1"[..]));
        assert_eq!((h.fencing_token, h.acquired_at), (Some(7), None));
        assert!(
            !h.backend.as_deref().unwrap_or("").contains("key "),
            "{h:?}"
        );
        // A record older than its key is another key's.
        let kvs = [
            kv("job/a", b"", 20, 20, 0xa),
            kv("xtr-meta/job/a", &rec(Some(b"gone"), Some(3)), 5, 5, 0xa),
        ];
        let records = records("", &kvs);
        let shown = lock_holders(b"job/", &kvs, &records);
        assert_eq!(
            (shown[0].0.meta.clone(), shown[0].0.fencing_token),
            (None, Some(20))
        );
    }

    #[test]
    fn a_re_saves_record_says_its_token() {
        let kvs = [
            kv("job/r-a", b"read", 10, 10, 0xa),
            kv(
                "xtr-meta/job/r-a",
                &rec(Some(b"new"), Some(11)),
                10,
                30,
                0xa,
            ),
        ];
        let records = records("", &kvs);
        let h = &lock_holders(b"job/", &kvs, &records)[0].0;
        assert_eq!(
            (h.meta.as_deref(), h.fencing_token),
            (Some(&b"new"[..]), Some(11))
        );
    }

    #[test]
    fn semaphores_show_permits_and_create_revisions() {
        let kvs = [
            kv("xtr-semaphore/s/a", b"limit=2 permits=1", 10, 10, 0xa),
            kv("xtr-semaphore/s/b", b"limit=2 permits=2", 11, 11, 0xb),
            kv(
                "xtr-meta/xtr-semaphore/s/a",
                &rec(Some(b"p"), None),
                10,
                10,
                0xa,
            ),
        ];
        let records = records("", &kvs);
        let (limit, shown) = semaphore_holders(b"xtr-semaphore/s/", &kvs, &records, None);
        assert_eq!(limit, Some(2));
        let (a, b) = (&shown[0].0, &shown[1].0);
        assert_eq!((a.permits, a.fencing_token), (Some(1), Some(10)));
        assert_eq!(a.meta.as_deref(), Some(&b"p"[..]));
        assert!(b.waiting && b.permits == Some(2));
        let (limit, shown) = semaphore_holders(b"xtr-semaphore/t/", &kvs, &records, None);
        assert_eq!((limit, shown.len()), (None, 0));
    }

    #[test]
    fn grouping_takes_recipe_keys_by_resource_and_skips_our_namespaces() {
        let kvs = vec![
            kv("app/l*/a/1f", b"", 1, 1, 0x1f),
            kv("app/l*/a/r-2f", b"read", 2, 2, 0x2f),
            kv("app/l*/a/b/3f", b"", 3, 3, 0x3f),
            kv("app/l*/config", b"x", 4, 4, 0),
            kv("app/l*/svc/web-1", b"x", 5, 5, 0x5f),
            kv("app/l*", b"", 6, 6, 0x6f),
            kv("app/other/7f", b"", 7, 7, 0x7f),
            kv(
                "app/xtr-semaphore/l*%2Fs/8f",
                b"limit=3 permits=1",
                8,
                8,
                0x8f,
            ),
            kv(
                "app/xtr-semaphore/x%2Fs/9f",
                b"limit=3 permits=1",
                9,
                9,
                0x9f,
            ),
            kv("app/xtr-meta/l*/a/1f", b"{}", 1, 1, 0x1f),
        ];
        let g = group("app/", "l*/", kvs);
        let locks: Vec<&String> = g.locks.keys().collect();
        assert_eq!(locks, ["l*/a", "l*/a/b"]);
        assert_eq!(g.locks["l*/a"].len(), 2);
        let sems: Vec<&String> = g.semaphores.keys().collect();
        assert_eq!(sems, ["l*/s"]);
        assert_eq!(g.records.len(), 1);
    }
}
