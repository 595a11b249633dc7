//! Watches on single keys: a waiter's on its predecessor (any change wakes it), a holder's on
//! its own key (a delete is a loss). Each starts from a revision the caller has read, so a
//! change between that read and the watch is replayed, not missed.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchFilterType, WatchOptions};
use tokio::sync::mpsc;

use super::conn::{Core, failure};
use crate::error::{Error, Result};
use crate::store::Watcher;

/// Waits until `key` changes (deleted, or its value rewritten) at or after revision `from`.
/// Also returns when etcd cancels the watch (the revision was compacted): the caller reads
/// again either way.
///
/// # Cancel safety
///
/// Cancel-safe: dropping it closes the watch.
pub(super) async fn changed(core: &Core, key: &[u8], from: i64) -> Result<()> {
    let member = core.member().await?;
    let failed = |e| member.failed(core.fail(failure("watch", e)));
    let options = WatchOptions::new().with_start_revision(from);
    let mut stream = member
        .client
        .watch_client()
        .watch(key.to_vec(), Some(options))
        .await
        .map_err(failed)?;
    loop {
        match stream.message().await {
            Ok(Some(answer)) => {
                if answer.canceled() || !answer.events().is_empty() {
                    return Ok(());
                }
            }
            Ok(None) => {
                return Err(core.fail(Error::storage("the watch stream ended").temporary()));
            }
            Err(e) => return Err(failed(e)),
        }
    }
}

/// An observer's watch on a lock's directory `dir`: registered (etcd answered that it is
/// created) before this returns, so every change after it is seen; the watcher completes on
/// the first put or delete of a key directly in `dir` (an acquisition, a release, a waiter
/// queueing or leaving, a value rewritten), or when the watch breaks or is cancelled (the
/// observer reads again either way). It puts nothing: it takes no place in the queue.
///
/// # Cancel safety
///
/// Cancel-safe: dropping it (or the watcher) closes the watch.
pub(super) async fn changes(core: &Core, dir: Vec<u8>) -> Result<Watcher> {
    let member = core.member().await?;
    let options = WatchOptions::new().with_prefix();
    let created = async {
        let mut stream = member
            .client
            .watch_client()
            .watch(dir.clone(), Some(options))
            .await
            .map_err(|e| failure("watch", e))?;
        match stream.message().await.map_err(|e| failure("watch", e))? {
            Some(answer) if answer.created() && !answer.canceled() => Ok(stream),
            _ => Err(Error::storage("etcd did not create the watch").temporary()),
        }
    };
    let mut stream = tokio::time::timeout(core.config.request_timeout, created)
        .await
        .map_err(|_| {
            Error::storage("etcd did not create the watch within the request timeout").temporary()
        })
        .and_then(|created| created)
        .map_err(|e| member.failed(core.fail(e)))?;
    Ok(Watcher::new(async move {
        loop {
            match stream.message().await {
                Ok(Some(answer)) if !answer.canceled() => {
                    let direct = |key: &[u8]| {
                        key.strip_prefix(dir.as_slice())
                            .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
                    };
                    if answer
                        .events()
                        .iter()
                        .filter_map(|e| e.kv())
                        .any(|kv| direct(kv.key()))
                    {
                        return;
                    }
                }
                _ => return,
            }
        }
    }))
}

/// Waits until the keys in `ahead` (each with the permits it takes) that are deleted at or
/// after revision `from` have given back `need` permits: a semaphore's waiter watches every
/// key before it (its directory, deletes only), and asks etcd nothing until they may fit.
/// Also returns when etcd cancels the watch (compacted): the caller reads again either way.
///
/// # Cancel safety
///
/// Cancel-safe: dropping it closes the watch.
pub(super) async fn freed(
    core: &Core,
    dir: &[u8],
    ahead: &[(Vec<u8>, u32)],
    need: u32,
    from: i64,
) -> Result<()> {
    let member = core.member().await?;
    let failed = |e| member.failed(core.fail(failure("watch", e)));
    let options = WatchOptions::new()
        .with_start_revision(from)
        .with_prefix()
        .with_filters([WatchFilterType::NoPut]);
    let mut stream = member
        .client
        .watch_client()
        .watch(dir.to_vec(), Some(options))
        .await
        .map_err(failed)?;
    // Keys are only ever queued behind this waiter: the first delete of a name seen here is
    // the delete of the key it waits for.
    let mut left: Vec<&(Vec<u8>, u32)> = ahead.iter().collect();
    let mut freed = 0u32;
    loop {
        let answer = match stream.message().await {
            Ok(Some(answer)) => answer,
            Ok(None) => {
                return Err(core.fail(Error::storage("the watch stream ended").temporary()));
            }
            Err(e) => return Err(failed(e)),
        };
        if answer.canceled() {
            return Ok(());
        }
        for kv in answer.events().iter().filter_map(|e| e.kv()) {
            if let Some(i) = left.iter().position(|(k, _)| k.as_slice() == kv.key()) {
                freed = freed.saturating_add(left.swap_remove(i).1);
            }
        }
        if freed >= need {
            return Ok(());
        }
    }
}

/// Watches `key` (created at `rev`) for its delete from `rev + 1` on, and sends `(key, rev)` on
/// `lost` when it goes. Keeps watching across broken streams and leader changes; after a
/// compaction it reads the key instead. Runs until aborted.
pub(super) fn loss(
    core: Arc<Core>,
    key: Vec<u8>,
    rev: i64,
    lost: mpsc::UnboundedSender<(Vec<u8>, i64)>,
) -> tokio::task::AbortHandle {
    tokio::spawn(async move {
        let mut from = rev + 1;
        let mut pause = Duration::from_millis(50);
        loop {
            match until_deleted(&core, &key, rev, &mut from).await {
                Ok(true) => {
                    let _ = lost.send((key, rev));
                    return;
                }
                Ok(false) => pause = Duration::from_millis(50),
                Err(e) => {
                    tracing::debug!(target: crate::logging::TARGET, store = %core.shown,
                        error = %e, "the watch on a held key broke; watching again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    })
    .abort_handle()
}

/// One watch: `Ok(true)` when the key is gone, `Ok(false)` when the watch must start again
/// (from `from`, moved past a compaction).
async fn until_deleted(core: &Core, key: &[u8], rev: i64, from: &mut i64) -> Result<bool> {
    let member = core.member().await?;
    let failed = |e| member.failed(failure("watch", e));
    let options = WatchOptions::new()
        .with_start_revision(*from)
        .with_filters([WatchFilterType::NoPut]);
    let mut stream = member
        .client
        .watch_client()
        .watch(key.to_vec(), Some(options))
        .await
        .map_err(failed)?;
    loop {
        let answer = stream
            .message()
            .await
            .map_err(failed)?
            .ok_or_else(|| Error::storage("the watch stream ended").temporary())?;
        if answer.compact_revision() > 0 || answer.canceled() {
            // History is gone: ask for the key itself.
            let got = core.get(key, GetOptions::new()).await?;
            if let Some(header) = got.header() {
                *from = header.revision() + 1;
            }
            return Ok(!got.kvs().iter().any(|kv| kv.create_revision() == rev));
        }
        // `from` stays: a watch started again replays this key's events since then (only
        // deletes pass the filter, and the first one ends it).
        if answer
            .events()
            .iter()
            .any(|e| e.event_type() == EventType::Delete)
        {
            return Ok(true);
        }
    }
}
