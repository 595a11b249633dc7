//! Introspection's requests: a resource's queue with its records (`holders`, `usage`), every
//! lock and semaphore under a prefix (`list`), and each holder's lease time left. What they
//! make of the keys is in `listing.rs`.

use std::time::Duration;

use etcd_client::{GetOptions, Txn, TxnOp};
use futures_util::StreamExt as _;

use super::listing::{self, Kv};
use super::{EtcdStore, queue, record, semaphore};
use crate::error::Result;
use crate::store::{HolderInfo, Listing, Usage};

/// Keys per range request while listing: a big keyspace is read in pages of this many, all at
/// one revision.
const PAGE: i64 = 500;

/// Lease time-to-live questions in flight at once.
const LEASE_QUESTIONS: usize = 32;

impl EtcdStore {
    /// The keys under `dir` and their records, in one transaction (one revision).
    async fn queue_and_records(&self, dir: &[u8], resource: &str) -> Result<Vec<Kv>> {
        let prefix = &self.core.config.prefix;
        let txn = Txn::new().and_then([
            TxnOp::get(dir.to_vec(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(
                record::key(prefix, dir),
                Some(GetOptions::new().with_prefix()),
            ),
        ]);
        let answer = self
            .core
            .txn(txn)
            .await
            .map_err(|e| e.with_resource(resource))?;
        Ok(semaphore::read_kvs(&answer.op_responses())
            .iter()
            .map(Kv::from)
            .collect())
    }

    /// A lock's queue in order, holders then waiters, with their records and time left.
    pub(super) async fn lock_holders(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let dir = queue::dir(&self.core.config.prefix, resource);
        let kvs = self.queue_and_records(&dir, resource).await?;
        let records = listing::records(&self.core.config.prefix, &kvs);
        Ok(self
            .with_time_left(listing::lock_holders(&dir, &kvs, &records))
            .await)
    }

    /// A semaphore's holders (waiters aside) and the permits they use, for holders of `limit`.
    pub(super) async fn semaphore_usage(&self, resource: &str, limit: u32) -> Result<Usage> {
        let dir = semaphore::dir(&self.core.config.prefix, resource);
        let kvs = self.queue_and_records(&dir, resource).await?;
        let records = listing::records(&self.core.config.prefix, &kvs);
        let (stored, shown) = listing::semaphore_holders(&dir, &kvs, &records, Some(limit));
        let held: Vec<(HolderInfo, i64)> = shown.into_iter().filter(|(h, _)| !h.waiting).collect();
        let holders = self.with_time_left(held).await;
        Ok(Usage {
            used: holders.iter().filter_map(|h| h.permits).sum(),
            limit: stored,
            holders,
        })
    }

    /// Every lock and semaphore under `wanted` that somebody holds: its keys and records read
    /// in pages at one revision, grouped by resource.
    pub(super) async fn list_held(&self, wanted: &str) -> Result<Vec<Listing>> {
        let prefix = &self.core.config.prefix;
        // `xtr-semaphore/<wanted, encoded>`: semaphores' directories encode their names.
        let encoded = String::from_utf8_lossy(&semaphore::dir("", wanted)).into_owned();
        let encoded = encoded.strip_suffix('/').unwrap_or(&encoded);
        let mut ranges = vec![format!("{prefix}{wanted}")];
        for ns in [
            format!("{prefix}{encoded}"),
            format!("{prefix}{}{wanted}", record::NAMESPACE),
            format!("{prefix}{}{encoded}", record::NAMESPACE),
        ] {
            // A range inside the first is read with it.
            if !ns.starts_with(&ranges[0]) {
                ranges.push(ns);
            }
        }
        let mut revision = None;
        let mut kvs = Vec::new();
        for range in ranges {
            self.read_range(range.as_bytes(), &mut revision, &mut kvs)
                .await?;
        }
        let grouped = listing::group(prefix, wanted, kvs);
        let records = listing::records(prefix, &grouped.records);
        let mut found: Vec<(Listing, Vec<i64>)> = Vec::new();
        for (resource, kvs) in &grouped.locks {
            let dir = queue::dir(prefix, resource);
            let shown = listing::lock_holders(&dir, kvs, &records);
            found.push(listed(Listing::lock(resource.clone(), Vec::new()), shown));
        }
        for (resource, kvs) in &grouped.semaphores {
            let dir = semaphore::dir(prefix, resource);
            let (limit, shown) = listing::semaphore_holders(&dir, kvs, &records, None);
            let empty = Listing::semaphore(resource.clone(), limit.unwrap_or(0), Vec::new());
            found.push(listed(empty, shown));
        }
        found.retain(|(l, _)| l.is_held());
        let mut out = Vec::with_capacity(found.len());
        for (mut listing, leases) in found {
            let pairs = std::mem::take(&mut listing.holders)
                .into_iter()
                .zip(leases)
                .collect();
            listing.holders = self.with_time_left(pairs).await;
            out.push(listing);
        }
        Ok(out)
    }

    /// Every key under `start` (a prefix) into `kvs`, in pages, at `revision` (the first
    /// page's when `None`, then kept).
    async fn read_range(
        &self,
        start: &[u8],
        revision: &mut Option<i64>,
        kvs: &mut Vec<Kv>,
    ) -> Result<()> {
        let end = prefix_end(start);
        let mut from = start.to_vec();
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if let Some(rev) = *revision {
                options = options.with_revision(rev);
            }
            let page = self.core.get(&from, options).await?;
            if revision.is_none() {
                *revision = page.header().map(|h| h.revision());
            }
            kvs.extend(page.kvs().iter().map(Kv::from));
            match page.kvs().last() {
                Some(last) if page.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(()),
            }
        }
    }

    /// `shown` with each holder's lease time left (`LEASE_QUESTIONS` questions at a time).
    async fn with_time_left(&self, shown: Vec<(HolderInfo, i64)>) -> Vec<HolderInfo> {
        let leases: Vec<i64> = shown.iter().map(|(_, lease)| *lease).collect();
        let left: Vec<Option<Duration>> = futures_util::stream::iter(leases)
            .map(|lease| self.lease_left(lease))
            .buffered(LEASE_QUESTIONS)
            .collect()
            .await;
        shown
            .into_iter()
            .zip(left)
            .map(|((mut info, _), remaining)| {
                info.remaining = remaining;
                info
            })
            .collect()
    }

    /// What is left of `lease` (`None` when it is gone, or for a key without one).
    async fn lease_left(&self, lease: i64) -> Option<Duration> {
        if lease == 0 {
            return None;
        }
        let ttl = self
            .core
            .call("lease time-to-live", |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await
            .ok()?;
        u64::try_from(ttl.ttl()).ok().map(Duration::from_secs)
    }
}

/// `listing` with `shown`'s holders, and their leases in the same order.
fn listed(mut listing: Listing, shown: Vec<(HolderInfo, i64)>) -> (Listing, Vec<i64>) {
    let (holders, leases) = shown.into_iter().unzip();
    listing.holders = holders;
    (listing, leases)
}

/// The end of the range of every key starting with `prefix` (etcd's: the prefix with its last
/// byte below 0xff incremented; `\0`, every key, when there is none).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_ends_as_etcd_counts_them() {
        assert_eq!(prefix_end(b"job/"), b"job0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), b"\0");
    }
}
