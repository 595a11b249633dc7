//! Counting semaphores on etcd: the layout, the transaction that queues a holder only when its
//! limit agrees with every key already there, and the rule that grants permits. Pure but for
//! building requests: every rule is unit-tested here.
//!
//! - A semaphore's keys live under `<prefix>xtr-semaphore/<resource>/` (the resource with `%`
//!   and `/` percent-encoded, so no semaphore's keys sit under another's), outside every
//!   lock's directory: `etcdctl lock NAME` (which reads all of `NAME/`) and our locks never
//!   see them.
//! - A holder's key is `<dir><lease id in hex>` on its lease, with the value
//!   `limit=<limit> permits=<count>`.
//! - The keys in create-revision order are a FIFO queue: a key holds when the permits of every
//!   key before it plus its own fit in the limit. A big waiter is never overtaken.
//! - A key is put only when the directory is empty or every key in it has the same limit (one
//!   transaction compares them): the limit binds while anybody holds or waits.

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use etcd_client::{KeyValue, TxnResponse};

use super::queue::{Entry, Place, others_before, value};
use crate::error::Error;
use crate::permits::Permits;

/// The namespace of every semaphore, under the DSN's prefix.
pub(super) const NAMESPACE: &str = "xtr-semaphore/";

/// The directory of `resource`'s semaphore: `<prefix>xtr-semaphore/<resource, % and /
/// encoded>/`.
pub(super) fn dir(prefix: &str, resource: &str) -> Vec<u8> {
    let encoded = resource.replace('%', "%25").replace('/', "%2F");
    format!("{prefix}{NAMESPACE}{encoded}/").into_bytes()
}

/// The resource a semaphore's directory name encodes (as [`dir`] wrote it).
pub(super) fn decode(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3);
        match code {
            Some("%2F") => out.push('/'),
            Some("%25") => out.push('%'),
            _ => {
                out.push('%');
                rest = &rest[at + 1..];
                continue;
            }
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    out
}

/// The permits `entry` takes, counted for a holder whose limit is `limit`: a key that is not
/// a holder of ours takes them all (it is never granted past).
pub(super) fn weight(entry: &Entry, limit: u32) -> u32 {
    entry.permits.map_or(limit, Permits::count)
}

/// One transaction: puts `key` (on `lease`, valued for `permits`) and reads the queue when the
/// directory is empty or every key in it has the same limit; else only reads it. The limit
/// is compared as the value's prefix: every value of limit `L` sorts strictly between
/// `limit=L ` and `limit=L!`. `then`: how the queue is read, and the key's record, put with it.
pub(super) fn put(
    dir: &[u8],
    key: Vec<u8>,
    permits: Permits,
    lease: i64,
    (list, record): (GetOptions, TxnOp),
) -> Txn {
    let put = TxnOp::put(
        key,
        value(permits),
        Some(PutOptions::new().with_lease(lease)),
    );
    let get = TxnOp::get(dir.to_vec(), Some(list));
    let limit = permits.limit();
    let agreed = Txn::new()
        .when([
            Compare::value(dir.to_vec(), CompareOp::Greater, format!("limit={limit} "))
                .with_prefix(),
            Compare::value(dir.to_vec(), CompareOp::Less, format!("limit={limit}!")).with_prefix(),
        ])
        .and_then([put.clone(), record.clone(), get.clone()])
        .or_else([get.clone()]);
    // A range compare on no key compares a key of create revision 0: true on an empty directory.
    Txn::new()
        .when([Compare::create_revision(dir.to_vec(), CompareOp::Equal, 0).with_prefix()])
        .and_then([put, record, get])
        .or_else([TxnOp::txn(agreed)])
}

/// Whether the put of [`put`]'s transaction landed (in either branch).
pub(super) fn landed(answer: &TxnResponse) -> bool {
    answer.succeeded()
        || answer
            .op_responses()
            .iter()
            .any(|r| matches!(r, TxnOpResponse::Txn(t) if t.succeeded()))
}

/// Every key a transaction read, its nested transactions' included.
pub(super) fn read_kvs(answers: &[TxnOpResponse]) -> Vec<KeyValue> {
    answers
        .iter()
        .flat_map(|a| match a {
            TxnOpResponse::Get(g) => g.kvs().to_vec(),
            TxnOpResponse::Txn(t) => read_kvs(&t.op_responses()),
            _ => Vec::new(),
        })
        .collect()
}

/// Why a holder of `permits` was not queued: the first key in `queue` whose limit is another,
/// a limit mismatch (or a key that is no holder's).
pub(super) fn refused(queue: &[Entry], permits: Permits, resource: &str) -> Error {
    let other = queue
        .iter()
        .find(|e| e.permits.is_none_or(|p| p.limit() != permits.limit()));
    match other {
        Some(Entry {
            permits: Some(p), ..
        }) => permits.limit_mismatch(resource, p.limit()),
        Some(e) => Error::invalid_argument(format!(
            "the semaphore's directory holds a key that is no holder's ({}): nobody can \
             take its permits until it is deleted",
            String::from_utf8_lossy(&e.key)
        ))
        .with_resource(resource),
        // Everyone left between the compare and the read: unlikely (one transaction reads
        // what it compared), but answered as a mismatch the caller may try again.
        None => Error::storage("the semaphore's limit could not be checked; try again")
            .temporary()
            .with_resource(resource),
    }
}

/// The place of `me` (a key taking `permits`) in `queue`, ignoring the keys on the holder's
/// `own` leases: it holds when the permits of the keys before it and its own fit in the
/// limit; else it waits until the keys before it give back what is missing.
pub(super) fn place(queue: &[Entry], me: &Entry, own: &[i64], permits: Permits) -> Place {
    let limit = permits.limit();
    let ahead: Vec<(Vec<u8>, u32)> = others_before(queue, me, own)
        .map(|e| (e.key.clone(), weight(e, limit)))
        .collect();
    let asked: u64 =
        ahead.iter().map(|(_, w)| u64::from(*w)).sum::<u64>() + u64::from(permits.count());
    match asked.checked_sub(u64::from(limit)) {
        None | Some(0) => Place::Mine,
        Some(over) => Place::Short {
            ahead,
            need: u32::try_from(over).unwrap_or(u32::MAX),
        },
    }
}

/// Which entries hold now (the rest wait), for a semaphore whose holders use `limit`: the
/// longest run from the front whose permits fit.
pub(super) fn holding(queue: &[Entry], limit: u32) -> Vec<bool> {
    let mut used = 0u64;
    queue
        .iter()
        .map(|e| {
            used += u64::from(weight(e, limit));
            used <= u64::from(limit)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::etcd::queue::{Kind, parse};

    fn e(rev: i64, lease: i64, limit: u32, count: u32) -> Entry {
        Entry {
            key: format!("s/{lease:x}").into_bytes(),
            rev,
            lease,
            kind: Kind::Writer,
            permits: Some(Permits::new(limit, count).unwrap()),
        }
    }

    fn p(limit: u32, count: u32) -> Permits {
        Permits::new(limit, count).unwrap()
    }

    #[test]
    fn layout() {
        assert_eq!(dir("app/", "exports"), b"app/xtr-semaphore/exports/");
        assert_eq!(dir("", "a/b%c"), b"xtr-semaphore/a%2Fb%25c/");
        for r in ["a/b%c", "a%2F", "%", "x%25/%2f", "plain"] {
            let d = String::from_utf8(dir("", r)).unwrap();
            let enc = d.trim_start_matches("xtr-semaphore/").trim_end_matches('/');
            assert_eq!(decode(enc), r);
        }
        assert_eq!(value(p(3, 2)), b"limit=3 permits=2");
        assert_eq!(parse(b"limit=3 permits=2"), Some(p(3, 2)));
        for bad in [
            &b""[..],
            b"read",
            b"limit=3",
            b"limit=3 permits=4",
            b"limit=x permits=1",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn values_of_one_limit_sort_between_the_bounds_and_no_other() {
        let inside = |v: &[u8], l: u32| {
            v > format!("limit={l} ").as_bytes() && v < format!("limit={l}!").as_bytes()
        };
        for (l, c) in [(3, 1), (3, 3), (1, 1), (1000, 999)] {
            assert!(inside(&value(p(l, c)), l));
        }
        assert!(!inside(&value(p(30, 1)), 3));
        assert!(!inside(&value(p(300, 3)), 30));
        assert!(!inside(&value(p(3, 1)), 30));
        assert!(!inside(b"", 3) && !inside(b"read", 3));
    }

    #[test]
    fn first_come_first_served_by_weight() {
        // Limit 3: two single holders, a waiter for 3, then a single newcomer.
        let q = [
            e(10, 1, 3, 1),
            e(11, 2, 3, 1),
            e(12, 3, 3, 3),
            e(13, 4, 3, 1),
        ];
        assert_eq!(place(&q, &q[1], &[], p(3, 1)), Place::Mine);
        let Place::Short { ahead, need } = place(&q, &q[2], &[], p(3, 3)) else {
            panic!("the big waiter waits");
        };
        assert_eq!((ahead.len(), need), (2, 2));
        // The newcomer fits in what is free (1), but waits behind the big waiter.
        let Place::Short { ahead, need } = place(&q, &q[3], &[], p(3, 1)) else {
            panic!("the newcomer does not overtake");
        };
        assert_eq!((ahead.len(), need), (3, 3));
        assert_eq!(holding(&q, 3), [true, true, false, false]);
        // Its own stale key does not count against a holder.
        assert_eq!(place(&q, &q[2], &[1, 2], p(3, 3)), Place::Mine);
    }

    #[test]
    fn a_key_that_is_no_holders_takes_every_permit() {
        let mut foreign = e(9, 7, 3, 1);
        foreign.permits = None;
        let q = [foreign, e(10, 1, 3, 1)];
        assert!(matches!(
            place(&q, &q[1], &[], p(3, 1)),
            Place::Short { need: 1, .. }
        ));
        assert_eq!(holding(&q, 3), [true, false]);
        let err = refused(&q, p(3, 1), "r").to_string();
        assert!(err.contains("no holder's"), "{err}");
        let err = refused(&[e(9, 7, 4, 1)], p(3, 1), "r").to_string();
        assert!(
            err.contains("limit of 4") && err.contains("limit of 3"),
            "{err}"
        );
    }
}
