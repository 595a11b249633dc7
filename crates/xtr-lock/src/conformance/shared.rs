//! Scenarios for stores with shared (read) locks, and the fallback for those without.

use super::{Harness, Outcome, require};
use crate::error::ErrorKind;
use crate::key::Mode;

/// Read first: two readers coexist, a writer conflicts, and the writer succeeds once both left.
pub async fn readers_coexist_and_a_writer_waits_for_both(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("readers");
    let (a, b, w) = (h.key(&r), h.key(&r), h.key(&r));
    h.store.save_read(&a, h.ttl).await.unwrap();
    h.store.save_read(&b, h.ttl).await.unwrap();
    assert!(h.store.exists(&a).await.unwrap() && h.store.exists(&b).await.unwrap());
    assert_eq!(
        h.store.save(&w, h.ttl).await.unwrap_err().kind(),
        ErrorKind::Conflict
    );
    h.store.delete(&a).await.unwrap();
    assert!(
        h.store.save(&w, h.ttl).await.unwrap_err().is_conflict(),
        "one reader left"
    );
    h.store.delete(&b).await.unwrap();
    h.store.save(&w, h.ttl).await.unwrap();
    assert!(h.store.exists(&w).await.unwrap());
    h.store.delete(&w).await.unwrap();
    Outcome::Ran
}

/// Write first: a reader conflicts with the writer and does not disturb it.
pub async fn writer_excludes_readers(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("writer-first");
    let (w, rd) = (h.key(&r), h.key(&r));
    h.store.save(&w, h.ttl).await.unwrap();
    assert!(
        h.store
            .save_read(&rd, h.ttl)
            .await
            .unwrap_err()
            .is_conflict()
    );
    assert!(h.store.exists(&w).await.unwrap());
    assert!(!h.store.exists(&rd).await.unwrap());
    h.store.delete(&w).await.unwrap();
    Outcome::Ran
}

/// Read, release, then write with the same holder: the write succeeds, another holder's read
/// then conflicts without disturbing it, and after the release nobody holds.
pub async fn read_release_then_write_with_the_same_holder(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("read-then-write");
    let (k, other) = (h.key(&r), h.key(&r));
    h.store.save_read(&k, h.ttl).await.unwrap();
    h.store.delete(&k).await.unwrap();
    h.store.save(&k, h.ttl).await.unwrap();
    assert!(
        h.store
            .save_read(&other, h.ttl)
            .await
            .unwrap_err()
            .is_conflict()
    );
    assert!(h.store.exists(&k).await.unwrap());
    h.store.delete(&k).await.unwrap();
    assert!(!h.store.exists(&k).await.unwrap());
    assert!(!h.store.exists(&other).await.unwrap());
    Outcome::Ran
}

/// A promotion while another reader holds conflicts, and the holder keeps its read lock, as the
/// store and the Lock both report (no peer does this right).
pub async fn promotion_with_other_readers_conflicts_and_keeps_the_read_lock(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("promotion-conflict");
    let a = h.lock(&r, h.ttl);
    let b = h.lock(&r, h.ttl);
    assert!(a.try_acquire_read().await.unwrap());
    assert!(b.try_acquire_read().await.unwrap());
    assert!(!a.try_acquire().await.unwrap(), "promotion conflicts");
    assert_eq!(a.held_mode(), Some(Mode::Read), "still believed to read");
    assert!(
        a.is_acquired().await.unwrap(),
        "still reads, says the store"
    );
    let w = h.lock(&r, h.ttl);
    assert!(
        !w.try_acquire().await.unwrap(),
        "a's read lock still excludes writers"
    );
    b.release().await.unwrap();
    assert!(a.try_acquire().await.unwrap(), "sole reader now: promotes");
    assert_eq!(a.held_mode(), Some(Mode::Write));
    a.release().await.unwrap();
    Outcome::Ran
}

/// The sole reader promotes, and then other holders cannot read.
pub async fn sole_reader_promotes(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("promote");
    let (k, other) = (h.key(&r), h.key(&r));
    h.store.save_read(&k, h.ttl).await.unwrap();
    h.store.save(&k, h.ttl).await.unwrap();
    assert!(
        h.store
            .save_read(&other, h.ttl)
            .await
            .unwrap_err()
            .is_conflict()
    );
    assert!(h.store.delete(&k).await.unwrap());
    h.store.save_read(&other, h.ttl).await.unwrap();
    h.store.delete(&other).await.unwrap();
    Outcome::Ran
}

/// Demotion: the writer becomes a reader, and another reader can join; writers still wait.
pub async fn writer_demotes_and_a_reader_joins(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("demote");
    let (k, reader, writer) = (h.key(&r), h.key(&r), h.key(&r));
    h.store.save(&k, h.ttl).await.unwrap();
    h.store.save_read(&k, h.ttl).await.unwrap();
    h.store.save_read(&reader, h.ttl).await.unwrap();
    assert!(h.store.exists(&k).await.unwrap());
    assert!(
        h.store
            .save(&writer, h.ttl)
            .await
            .unwrap_err()
            .is_conflict()
    );
    h.store.delete(&k).await.unwrap();
    h.store.delete(&reader).await.unwrap();
    h.store.save(&writer, h.ttl).await.unwrap();
    h.store.delete(&writer).await.unwrap();
    Outcome::Ran
}

/// Without shared locks, a read acquire takes the write lock, so two "readers" exclude each
/// other.
pub async fn read_falls_back_to_write_without_shared_locks(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(!h.caps().shared, "the store has shared locks");
    let r = h.resource("read-fallback");
    let (a, b) = (h.lock(&r, h.ttl), h.lock(&r, h.ttl));
    assert!(a.try_acquire_read().await.unwrap());
    assert_eq!(a.held_mode(), Some(Mode::Write));
    assert!(!b.try_acquire_read().await.unwrap());
    a.release().await.unwrap();
    Outcome::Ran
}
