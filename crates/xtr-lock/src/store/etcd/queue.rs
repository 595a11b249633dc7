//! The queue of one resource: the keys directly under `<prefix><resource>/`, in create-revision
//! order, and whose place it is to go next. Pure: no I/O, so every rule is unit-tested here.
//!
//! - Every key directly under the directory is a queue entry (`etcdctl lock` puts
//!   `<resource>/<lease id in hex>` with an empty value). Keys deeper down (`<resource>/a/b`)
//!   belong to another resource (`<resource>/a`) and are ignored.
//! - A key whose value is `read` is a reader; every other key is a writer.
//! - A writer holds when no key has a lower create revision; a reader when no writer has.
//! - A holder's own keys never block it: every key on one of its leases is its own (it may
//!   have two during a promotion, and a key whose delete has not landed yet).

/// The value that makes a key a reader. A writer's value is its holder's metadata: empty, as
/// `etcdctl lock` leaves it, without.
pub(super) const READER: &[u8] = b"read";

/// A key's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Reader,
    Writer,
}

impl Kind {
    pub(super) fn of(value: &[u8]) -> Kind {
        if value == READER {
            Kind::Reader
        } else {
            Kind::Writer
        }
    }
}

/// A semaphore holder's value (its layout is in `semaphore.rs`): `limit=<limit> permits=<count>`.
pub(super) fn value(permits: crate::permits::Permits) -> Vec<u8> {
    format!("limit={} permits={}", permits.limit(), permits.count()).into_bytes()
}

/// The permits a value records (`None` for a value no holder of ours wrote).
pub(super) fn parse(value: &[u8]) -> Option<crate::permits::Permits> {
    let text = std::str::from_utf8(value).ok()?;
    let (limit, count) = text.strip_prefix("limit=")?.split_once(" permits=")?;
    crate::permits::Permits::new(limit.parse().ok()?, count.parse().ok()?).ok()
}

/// One key in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) key: Vec<u8>,
    pub(super) rev: i64,
    pub(super) lease: i64,
    pub(super) kind: Kind,
    /// The permits a semaphore's key records (`None` for a lock's key).
    pub(super) permits: Option<crate::permits::Permits>,
}

/// The directory of `resource`: `<prefix><resource>/`.
pub(super) fn dir(prefix: &str, resource: &str) -> Vec<u8> {
    format!("{prefix}{resource}/").into_bytes()
}

/// The names a holder's keys can have under the directory, for its lease: a fresh writer's is
/// `<lease hex>` (`etcdctl lock`'s layout), a fresh reader's `r-<lease hex>`, and a writer's
/// whose read key already has the plain name (it was a writer that demoted) `w-<lease hex>`.
pub(super) fn name(dir: &[u8], lease: i64, kind: Kind, taken: Option<&[u8]>) -> Vec<u8> {
    let hex = format!("{lease:x}");
    let mut key = dir.to_vec();
    match kind {
        Kind::Reader => key.extend_from_slice(format!("r-{hex}").as_bytes()),
        Kind::Writer => {
            let mut plain = dir.to_vec();
            plain.extend_from_slice(hex.as_bytes());
            if taken == Some(plain.as_slice()) {
                key.extend_from_slice(format!("w-{hex}").as_bytes());
            } else {
                return plain;
            }
        }
    }
    key
}

/// The entries among `kvs` (key, value, create revision, lease) that sit directly under `dir`,
/// in create-revision order.
pub(super) fn entries<'a>(
    dir: &[u8],
    kvs: impl IntoIterator<Item = (&'a [u8], &'a [u8], i64, i64)>,
) -> Vec<Entry> {
    let mut out: Vec<Entry> = kvs
        .into_iter()
        .filter(|(k, ..)| {
            k.strip_prefix(dir)
                .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
        })
        .map(|(k, v, rev, lease)| Entry {
            key: k.to_vec(),
            rev,
            lease,
            kind: Kind::of(v),
            permits: parse(v),
        })
        .collect();
    out.sort_by_key(|e| e.rev);
    out
}

/// A key's place in its queue: first (its lock is granted), after another key, or in a
/// promotion that cannot be granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Place {
    /// The key holds.
    Mine,
    /// The key waits for this one (the nearest key before it that blocks it) to go or change.
    After(Entry),
    /// A semaphore's key waits until the keys before it (with the permits each takes) give
    /// back `need` more permits.
    Short {
        ahead: Vec<(Vec<u8>, u32)>,
        need: u32,
    },
    /// A promotion that would wait forever: a writer queued before the holder's new writer key
    /// came after its read key, and waits for it.
    Deadlock,
}

/// The place of `me` in `queue`, ignoring the keys on the holder's `own` leases. `promoting`:
/// the holder also reads, so every writer queued before `me` waits for the holder's read key.
pub(super) fn place(queue: &[Entry], me: &Entry, own: &[i64], promoting: bool) -> Place {
    let before = others_before(queue, me, own);
    let blocking: Vec<&Entry> = match me.kind {
        Kind::Writer => {
            let before: Vec<&Entry> = before.collect();
            if promoting && before.iter().any(|e| e.kind == Kind::Writer) {
                return Place::Deadlock;
            }
            before
        }
        Kind::Reader => before.filter(|e| e.kind == Kind::Writer).collect(),
    };
    match blocking.last() {
        Some(e) => Place::After((*e).clone()),
        None => Place::Mine,
    }
}

/// The keys queued before `me` that are not on one of the holder's `own` leases (a key without
/// a lease is nobody's own).
pub(super) fn others_before<'a>(
    queue: &'a [Entry],
    me: &'a Entry,
    own: &'a [i64],
) -> impl Iterator<Item = &'a Entry> {
    queue
        .iter()
        .filter(|e| e.rev < me.rev && !(e.lease != 0 && own.contains(&e.lease)))
}

/// Which entries hold now (the rest wait), for introspection: a writer holds when it is first,
/// a reader when no writer is before it. A promoting holder's writer key is shown waiting while
/// its read key holds.
pub(super) fn holding(queue: &[Entry]) -> Vec<bool> {
    queue
        .iter()
        .enumerate()
        .map(|(i, e)| match e.kind {
            // Only the holder's own read key may be before a writer that holds (a promotion
            // granted a moment before the read key goes).
            Kind::Writer => queue[..i].iter().all(|b| b.lease == e.lease),
            Kind::Reader => queue[..i].iter().all(|b| b.kind == Kind::Reader),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(key: &str, rev: i64, lease: i64, kind: Kind) -> Entry {
        Entry {
            key: key.as_bytes().to_vec(),
            rev,
            lease,
            kind,
            permits: None,
        }
    }

    #[test]
    fn names_follow_etcdctl_for_writers() {
        let d = dir("app/", "job");
        assert_eq!(d, b"app/job/");
        assert_eq!(name(&d, 0x694d, Kind::Writer, None), b"app/job/694d");
        assert_eq!(name(&d, 0x694d, Kind::Reader, None), b"app/job/r-694d");
        assert_eq!(
            name(&d, 0x694d, Kind::Writer, Some(b"app/job/694d")),
            b"app/job/w-694d"
        );
        assert_eq!(
            name(&d, 0x694d, Kind::Writer, Some(b"app/job/r-694d")),
            b"app/job/694d"
        );
    }

    #[test]
    fn only_direct_children_in_revision_order() {
        let kvs: Vec<(&[u8], &[u8], i64, i64)> = vec![
            (b"a/2", b"", 7, 2),
            (b"a/b/3", b"", 3, 3),
            (b"a/1", b"read", 5, 1),
            (b"a/", b"", 2, 4),
            (b"ab/1", b"", 1, 5),
        ];
        let q = entries(b"a/", kvs);
        assert_eq!(
            q,
            [e("a/1", 5, 1, Kind::Reader), e("a/2", 7, 2, Kind::Writer)]
        );
    }

    #[test]
    fn writers_wait_for_anything_before_them_readers_for_writers() {
        let q = [
            e("r/r-1", 10, 1, Kind::Reader),
            e("r/2", 11, 2, Kind::Writer),
            e("r/r-3", 12, 3, Kind::Reader),
            e("r/4", 13, 4, Kind::Writer),
        ];
        assert_eq!(place(&q, &q[0], &[], false), Place::Mine);
        assert_eq!(place(&q, &q[1], &[], false), Place::After(q[0].clone()));
        // A reader after a queued writer waits for it: writers are not starved.
        assert_eq!(place(&q, &q[2], &[], false), Place::After(q[1].clone()));
        assert_eq!(place(&q, &q[3], &[], false), Place::After(q[2].clone()));
        assert_eq!(holding(&q), [true, false, false, false]);
        let readers = [
            e("r/r-1", 10, 1, Kind::Reader),
            e("r/r-2", 11, 2, Kind::Reader),
        ];
        assert_eq!(place(&readers, &readers[1], &[], false), Place::Mine);
        assert_eq!(holding(&readers), [true, true]);
    }

    #[test]
    fn a_promotion_ignores_its_own_read_key_and_gives_way_to_a_queued_writer() {
        // A reads (10), B reads (11), A promotes (12): A waits for B only.
        let mut q = vec![
            e("r/r-a", 10, 0xa, Kind::Reader),
            e("r/r-b", 11, 0xb, Kind::Reader),
            e("r/a", 12, 0xa, Kind::Writer),
        ];
        let own = [0xa];
        assert_eq!(place(&q, &q[2], &own, true), Place::After(q[1].clone()));
        // B promotes too (13): A's writer key is before it, and waits for B's read key.
        q.push(e("r/b", 13, 0xb, Kind::Writer));
        assert_eq!(place(&q, &q[3], &[0xb], true), Place::Deadlock);
        // A plain writer queued before a promotion: the same.
        let q = [
            e("r/r-a", 10, 0xa, Kind::Reader),
            e("r/c", 11, 0xc, Kind::Writer),
            e("r/a", 12, 0xa, Kind::Writer),
        ];
        assert_eq!(place(&q, &q[2], &own, true), Place::Deadlock);
        // The sole reader promotes at once.
        let q = [
            e("r/r-a", 10, 0xa, Kind::Reader),
            e("r/a", 12, 0xa, Kind::Writer),
        ];
        assert_eq!(place(&q, &q[1], &own, true), Place::Mine);
    }

    #[test]
    fn a_demoted_key_keeps_its_place_and_lets_readers_in() {
        // A wrote (10) and demoted in place; B's writer (11) still waits, C's reader (12)
        // waits for B, not for A.
        let q = [
            e("r/a", 10, 0xa, Kind::Reader),
            e("r/b", 11, 0xb, Kind::Writer),
            e("r/r-c", 12, 0xc, Kind::Reader),
        ];
        assert_eq!(place(&q, &q[1], &[], false), Place::After(q[0].clone()));
        assert_eq!(place(&q, &q[2], &[], false), Place::After(q[1].clone()));
        assert_eq!(holding(&q), [true, false, false]);
    }

    #[test]
    fn a_holders_stale_keys_never_make_it_wait_for_itself() {
        // A's read key (10) outlived its promotion (its delete did not land), and a key of a
        // lease A gave up (being revoked) sits before it too: A's writer key (12) holds.
        let q = [
            e("r/7", 9, 0x7, Kind::Writer),
            e("r/r-a", 10, 0xa, Kind::Reader),
            e("r/a", 12, 0xa, Kind::Writer),
        ];
        assert_eq!(place(&q, &q[2], &[0xa, 0x7], false), Place::Mine);
        // Someone else's key still blocks, and so does a key without a lease.
        assert_eq!(place(&q, &q[2], &[0xa], false), Place::After(q[0].clone()));
        let q = [
            e("r/x", 9, 0, Kind::Writer),
            e("r/a", 12, 0xa, Kind::Writer),
        ];
        assert_eq!(
            place(&q, &q[1], &[0xa, 0], false),
            Place::After(q[0].clone())
        );
    }
}
