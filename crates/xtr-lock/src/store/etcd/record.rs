//! Holder records: what this library keeps about each of its queue keys (when the holder
//! acquired, its metadata, a fencing token) in a namespace of its own, `<prefix>xtr-meta/`,
//! where `etcdctl lock`, `etcdctl elect` and Go's recipes never look. Pure but for building
//! requests: the layout is unit-tested here.
//!
//! - The record of the queue key `<prefix><rest>` is `<prefix>xtr-meta/<rest>`: a lock's
//!   `<prefix>xtr-meta/<resource>/<name>`, a semaphore's
//!   `<prefix>xtr-meta/xtr-semaphore/<resource, encoded>/<name>`. One record per key (a
//!   promoting holder has two keys, so two records).
//! - It is put in the transaction that puts (or re-reads) its key, on the same lease, and
//!   deleted in the transaction that deletes the key: it dies with the key's lease, and is
//!   only ever read beside its key (a record whose key is gone is ignored).
//! - Its value is [`HolderRecord::encode`], one line of JSON. A record put while reading the
//!   queue carries no token: the revision of that put is the token of the grant it saw, so it
//!   is the record's mod revision. A re-save that changes the metadata writes the token it
//!   keeps into the record.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::error::{Error, Result};
use crate::meta::HolderRecord;

/// The namespace of every record, under the DSN's prefix.
pub(super) const NAMESPACE: &str = "xtr-meta/";

/// The record key of `queue_key` (which starts with `prefix`).
pub(super) fn key(prefix: &str, queue_key: &[u8]) -> Vec<u8> {
    let rest = queue_key.get(prefix.len()..).unwrap_or(queue_key);
    let mut k = format!("{prefix}{NAMESPACE}").into_bytes();
    k.extend_from_slice(rest);
    k
}

/// The queue key `record_key` describes (`None` for a key outside the namespace).
pub(super) fn described(prefix: &str, record_key: &[u8]) -> Option<Vec<u8>> {
    let rest = record_key.strip_prefix(format!("{prefix}{NAMESPACE}").as_bytes())?;
    let mut k = prefix.as_bytes().to_vec();
    k.extend_from_slice(rest);
    Some(k)
}

/// Puts `record` for `queue_key`, on `lease`.
pub(super) fn put(prefix: &str, queue_key: &[u8], record: &HolderRecord, lease: i64) -> TxnOp {
    TxnOp::put(
        key(prefix, queue_key),
        record.encode(),
        Some(PutOptions::new().with_lease(lease)),
    )
}

/// The fencing token a waiter's record says: it is queued, and its holder has not yet seen a
/// grant (revisions start at 1, so no grant's token is 0).
pub(super) const PENDING: u64 = 0;

/// Whether `stored` is a waiter's (its holder has not seen a grant yet).
pub(super) fn pending(record: &HolderRecord) -> bool {
    record.fencing_token == Some(PENDING)
}

/// A nested transaction that puts `granted` (the record of a grant, without a token: its
/// revision is the token) when the queue of `dir` certainly grants the key of `kind` created
/// at `rev` (`None`: the key is put by the same transaction; compares are evaluated before
/// anything is written), else `pending` (a waiter's record) if given. Certainly: nothing is
/// older in the directory (empty, or every create revision at least `rev`), or, for a reader,
/// every key there is a reader. Where the rule grants but these do not say so (readers behind
/// older readers, a promotion, a holder's own stale key, a deeper resource's key), the holder
/// writes its record after the grant.
pub(super) fn put_if_granted(
    dir: &[u8],
    kind: super::queue::Kind,
    rev: Option<i64>,
    granted: TxnOp,
    pending: Option<TxnOp>,
) -> TxnOp {
    let first = match rev {
        None => Compare::create_revision(dir.to_vec(), CompareOp::Equal, 0).with_prefix(),
        Some(rev) => {
            Compare::create_revision(dir.to_vec(), CompareOp::Greater, rev - 1).with_prefix()
        }
    };
    let otherwise: Vec<TxnOp> = pending.into_iter().collect();
    let otherwise = match kind {
        super::queue::Kind::Writer => otherwise,
        super::queue::Kind::Reader => vec![TxnOp::txn(
            Txn::new()
                .when([
                    Compare::value(dir.to_vec(), CompareOp::Equal, super::queue::READER)
                        .with_prefix(),
                ])
                .and_then([granted.clone()])
                .or_else(otherwise),
        )],
    };
    TxnOp::txn(
        Txn::new()
            .when([first])
            .and_then([granted])
            .or_else(otherwise),
    )
}

/// Whether the transaction answered by `answers` put a grant's record through
/// [`put_if_granted`] (one of its nested transactions took its `then` branch).
pub(super) fn granted_in(answers: &[TxnOpResponse]) -> bool {
    answers.iter().any(|a| match a {
        TxnOpResponse::Txn(t) => t.succeeded() || granted_in(&t.op_responses()),
        _ => false,
    })
}

/// Deletes the record of `queue_key`.
pub(super) fn delete(prefix: &str, queue_key: &[u8]) -> TxnOp {
    TxnOp::delete(key(prefix, queue_key), None)
}

/// Lock resources whose directory would hold this library's own keys: refused.
pub(super) fn refuse_reserved(resource: &str) -> Result<()> {
    for ns in [NAMESPACE, super::semaphore::NAMESPACE] {
        if resource.starts_with(ns) {
            return Err(Error::invalid_argument(format!(
                "lock names starting with {ns:?} are reserved on etcd (this library keeps its \
                 own keys there)"
            ))
            .with_resource(resource));
        }
    }
    Ok(())
}

/// The value a writer's key gets: its metadata, raw (`etcdctl elect -l` prints it, and an
/// election's proposal is its candidate's metadata). A writer whose metadata is `read` would
/// be taken for a reader by everybody reading the queue: refused.
pub(super) fn writer_value(meta: Option<&[u8]>) -> Result<Vec<u8>> {
    match meta {
        Some(m) if m == super::queue::READER => Err(Error::invalid_argument(
            "holder metadata \"read\" cannot be a writer's on etcd: the value of a writer's \
             key is its metadata, and \"read\" marks a reader's key",
        )),
        Some(m) => Ok(m.to_vec()),
        None => Ok(Vec::new()),
    }
}

/// A record read back, with the revision it was last written at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stored {
    pub(super) record: HolderRecord,
    pub(super) mod_rev: i64,
}

impl Stored {
    /// The token of the grant this record describes: the one it says, else the revision it
    /// was put at (the revision of the read that granted).
    pub(super) fn token(&self) -> Option<u64> {
        self.record
            .fencing_token
            .or_else(|| u64::try_from(self.mod_rev).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_sit_beside_their_keys_in_a_namespace_of_their_own() {
        assert_eq!(key("app/", b"app/job/694d"), b"app/xtr-meta/job/694d");
        assert_eq!(key("", b"job/a/r-694d"), b"xtr-meta/job/a/r-694d");
        assert_eq!(
            key("", b"xtr-semaphore/a%2Fb/7"),
            b"xtr-meta/xtr-semaphore/a%2Fb/7"
        );
        assert_eq!(
            described("app/", b"app/xtr-meta/job/694d"),
            Some(b"app/job/694d".to_vec())
        );
        assert_eq!(described("app/", b"app/job/694d"), None);
    }

    #[test]
    fn reserved_names_and_a_writer_named_read_are_refused() {
        assert!(refuse_reserved("xtr-meta/job").is_err());
        assert!(refuse_reserved("xtr-semaphore/job").is_err());
        assert!(refuse_reserved("xtr-meta").is_ok() && refuse_reserved("job").is_ok());
        let err = writer_value(Some(b"read")).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
        assert_eq!(writer_value(Some(b"P1")).unwrap(), b"P1");
        assert_eq!(writer_value(None).unwrap(), b"");
    }

    #[test]
    fn the_token_is_the_records_own_else_its_revision() {
        let at = std::time::UNIX_EPOCH;
        let s = Stored {
            record: HolderRecord::new(None, at),
            mod_rev: 42,
        };
        assert_eq!(s.token(), Some(42));
        let s = Stored {
            record: HolderRecord::new(None, at).with_fencing_token(Some(7)),
            mod_rev: 42,
        };
        assert_eq!(s.token(), Some(7));
    }
}
