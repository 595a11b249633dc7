//! Scenarios for stores with shared (read) locks, and the fallback for those without.

use super::{Harness, Outcome, require};
use crate::key::{Key, Mode};
use crate::lock::lockable::Lockable as _;
use crate::lock::lockable::Release;
use crate::store::Holding;

/// Read first: two readers coexist, a writer conflicts, and the writer succeeds once both left.
pub async fn readers_coexist_and_a_writer_waits_for_both(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("readers");
    let (a, b, w) = (h.key(&r), h.key(&r), h.key(&r));
    assert!(h.store.save_read(&a, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.save_read(&b, h.ttl).await.unwrap().is_acquired());
    for reader in [&a, &b] {
        assert_eq!(
            h.store.exists(reader).await.unwrap(),
            Holding::Held(Mode::Read),
            "exists says it reads"
        );
    }
    assert!(h.store.save(&w, h.ttl).await.unwrap().is_conflict());
    h.store.delete(&a).await.unwrap();
    assert!(
        h.store.save(&w, h.ttl).await.unwrap().is_conflict(),
        "one reader left"
    );
    h.store.delete(&b).await.unwrap();
    assert!(h.store.save(&w, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.exists(&w).await.unwrap().is_held());
    h.store.delete(&w).await.unwrap();
    Outcome::Ran
}

/// Write first: a reader conflicts with the writer and does not disturb it.
pub async fn writer_excludes_readers(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("writer-first");
    let (w, rd) = (h.key(&r), h.key(&r));
    assert!(h.store.save(&w, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.save_read(&rd, h.ttl).await.unwrap().is_conflict());
    assert_eq!(
        h.store.exists(&w).await.unwrap(),
        Holding::Held(Mode::Write),
        "exists says it writes"
    );
    assert!(!h.store.exists(&rd).await.unwrap().is_held());
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
    assert!(h.store.save_read(&k, h.ttl).await.unwrap().is_acquired());
    h.store.delete(&k).await.unwrap();
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    assert!(
        h.store
            .save_read(&other, h.ttl)
            .await
            .unwrap()
            .is_conflict()
    );
    assert!(h.store.exists(&k).await.unwrap().is_held());
    h.store.delete(&k).await.unwrap();
    assert!(!h.store.exists(&k).await.unwrap().is_held());
    assert!(!h.store.exists(&other).await.unwrap().is_held());
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
    let _ = b.release().await.unwrap();
    assert!(a.try_acquire().await.unwrap(), "sole reader now: promotes");
    assert_eq!(a.held_mode(), Some(Mode::Write));
    let _ = a.release().await.unwrap();
    Outcome::Ran
}

/// A key that travelled to another process while reading (serialized, then deserialized) is
/// known to read: the store says a refused promotion keeps its read lock, the lock takes its
/// word (it never guesses a mode), a promotion cancelled while waiting keeps the read lock too,
/// and its release lets go of the read lock for the original holder as well.
pub async fn a_travelled_reader_keeps_its_read_lock_when_promotion_is_refused(
    h: Harness,
) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    require!(
        h.caps().serializable_keys,
        "keys of this store cannot travel"
    );
    let r = h.resource("travelled-reader");
    let (a, b) = (h.lock(&r, h.ttl), h.lock(&r, h.ttl));
    assert!(a.try_acquire_read().await.unwrap());
    assert!(b.try_acquire_read().await.unwrap());
    let travel = || {
        let key = Key::from_json_with_clock(&a.key().to_json().unwrap(), h.clock.clone()).unwrap();
        h.factory().create_lock_from_key(key).with_ttl(h.ttl)
    };
    let refused = h.store.save(travel().key(), h.ttl).await.unwrap();
    assert_eq!(
        refused.conflict().map(|c| c.kept),
        Some(Some(Mode::Read)),
        "the store says the read lock is kept"
    );
    let travelled = travel();
    assert!(!travelled.try_acquire().await.unwrap(), "promotion refused");
    assert_eq!(
        travelled.held_mode(),
        Some(Mode::Read),
        "the lock knows it still reads"
    );
    let cancelled = travel();
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(50), cancelled.acquire())
            .await
            .is_err()
    );
    assert!(
        cancelled.is_acquired().await.unwrap(),
        "a cancelled promotion keeps the read lock"
    );
    let w = h.lock(&r, h.ttl);
    assert!(
        !w.try_acquire().await.unwrap(),
        "the read lock still excludes"
    );
    assert_eq!(travelled.release().await.unwrap(), Release::Released);
    assert!(
        !a.is_acquired().await.unwrap(),
        "one holder: released for a too"
    );
    let _ = b.release().await.unwrap();
    assert!(w.try_acquire().await.unwrap());
    let _ = w.release().await.unwrap();
    Outcome::Ran
}

/// The sole reader promotes, and then other holders cannot read.
pub async fn sole_reader_promotes(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("promote");
    let (k, other) = (h.key(&r), h.key(&r));
    assert!(h.store.save_read(&k, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    assert_eq!(
        h.store.exists(&k).await.unwrap(),
        Holding::Held(Mode::Write)
    );
    assert!(
        h.store
            .save_read(&other, h.ttl)
            .await
            .unwrap()
            .is_conflict()
    );
    assert!(h.store.delete(&k).await.unwrap());
    assert!(
        h.store
            .save_read(&other, h.ttl)
            .await
            .unwrap()
            .is_acquired()
    );
    h.store.delete(&other).await.unwrap();
    Outcome::Ran
}

/// Demotion: the writer becomes a reader, and another reader can join; writers still wait.
pub async fn writer_demotes_and_a_reader_joins(h: Harness) -> Outcome {
    require!(h.caps().excludes, "the store locks nothing");
    require!(h.caps().shared, "no shared locks");
    let r = h.resource("demote");
    let (k, reader, writer) = (h.key(&r), h.key(&r), h.key(&r));
    assert!(h.store.save(&k, h.ttl).await.unwrap().is_acquired());
    assert!(h.store.save_read(&k, h.ttl).await.unwrap().is_acquired());
    assert!(
        h.store
            .save_read(&reader, h.ttl)
            .await
            .unwrap()
            .is_acquired()
    );
    assert_eq!(
        h.store.exists(&k).await.unwrap(),
        Holding::Held(Mode::Read),
        "the demoted writer reads"
    );
    assert!(h.store.save(&writer, h.ttl).await.unwrap().is_conflict());
    h.store.delete(&k).await.unwrap();
    h.store.delete(&reader).await.unwrap();
    assert!(h.store.save(&writer, h.ttl).await.unwrap().is_acquired());
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
    let _ = a.release().await.unwrap();
    Outcome::Ran
}
