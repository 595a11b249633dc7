//! Memcached's counting semaphores: a holder of `count` permits holds `count` of the
//! semaphore's `limit` slot keys (see `sem_ops`), apart from the lock of the same name.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::records;
use super::sem_ops::{self, Admit, MAX_NAME};
use super::{HolderState, KIND, MemcachedStore, Run};
use crate::error::{Error, LostReason, Result};
use crate::key::{Key, Mode};
use crate::permits::Permits;
use crate::store::{Acquired, Conflict, HolderInfo, Holding, Saved, Usage, check_expiry};

impl MemcachedStore {
    /// The semaphore's name as its keys' stem: a valid key with room for `:sem:limit`.
    fn sem_name(&self, resource: &str) -> Result<String> {
        if Self::is_valid_name(resource)
            && resource.len() <= MAX_NAME
            && !super::records::is_reserved(resource)
        {
            return Ok(resource.to_owned());
        }
        Err(Error::invalid_argument(format!(
            "Memcached keeps a semaphore under keys made of its name and `:sem:<slot>`: the name \
             must be 1 to {MAX_NAME} bytes without spaces or control characters"
        ))
        .with_resource(resource.chars().take(100).collect::<String>())
        .with_store(self))
    }

    /// The name waiters of a semaphore are woken by (its limit key: never a lock's wake name
    /// unless a lock is named so).
    pub(super) fn sem_wake(resource: &str) -> String {
        sem_ops::limit_key(resource)
    }

    /// Adds free slots one by one; a holder that cannot take all its permits gives back what
    /// it took and is refused.
    pub(super) async fn sem_save(
        &self,
        key: &Key,
        permits: Permits,
        ttl: Option<Duration>,
    ) -> Result<Saved> {
        let name = self.sem_name(key.resource())?;
        let (secs, state, token, how) = self.before_add(key, ttl)?;
        let rec_key = records::sem_record(&name, token.as_bytes());
        let record = self.record_to_set(key, &state, &rec_key, &token, secs);
        let admitted = self
            .run(key.resource(), how, move |mut c| {
                let (name, token, record) = (name.clone(), token.clone(), record.clone());
                async move {
                    let r = sem_ops::admit_on(&mut c, &name, token.as_bytes(), permits, secs).await;
                    if matches!(r, Ok(Admit::Taken)) {
                        records::queue(&mut c, &record).await;
                    }
                    (c, r)
                }
            })
            .await?;
        match admitted {
            Admit::Taken => {
                check_expiry(self, key).await?;
                Ok(Saved::Acquired(Acquired::new()))
            }
            Admit::Full(left) => {
                // Releases here wake the waiters; anyone else's are found by polling.
                state.here.store(false, Ordering::Release);
                *crate::mutex::lock(&state.acquired_at) = None;
                let conflict = Conflict::new();
                Ok(Saved::Conflict(match left {
                    Some(s) if s > 0 => conflict.with_retry_after(Duration::from_secs(s)),
                    _ => conflict,
                }))
            }
            Admit::CountChanged(held) => {
                Err(permits.count_changed(key.resource(), held).with_store(self))
            }
            Admit::Mismatch(stored) => Err(permits
                .limit_mismatch(key.resource(), stored)
                .with_store(self)),
        }
    }

    /// Reads the slots and extends the holder's by CAS; never re-creates one that is gone.
    pub(super) async fn sem_put_off(
        &self,
        key: &Key,
        permits: Permits,
        ttl: Duration,
    ) -> Result<Holding> {
        if !key.has_token(KIND) {
            return Ok(Holding::NotHeld(LostReason::Removed));
        }
        let secs = self.seconds(key, Some(ttl))?;
        let was_expired = key.is_expired();
        if secs < 2 {
            key.reduce_lifetime(Duration::ZERO);
            check_expiry(self, key).await?;
        }
        let name = self.sem_name(key.resource())?;
        key.reduce_lifetime(Duration::from_secs(secs.saturating_sub(1)));
        let token = key.token(KIND);
        let touch = records::touch(&records::sem_record(&name, token.as_bytes()), secs);
        let held = self
            .run(key.resource(), self.keeping(key), move |mut c| {
                let (name, token, touch) = (name.clone(), token.clone(), touch.clone());
                async move {
                    let r = sem_ops::put_off_sem_on(&mut c, &name, permits, token.as_bytes(), secs)
                        .await;
                    if matches!(r, Ok(true)) {
                        records::queue(&mut c, &touch).await;
                    }
                    (c, r)
                }
            })
            .await?;
        if held {
            check_expiry(self, key).await?;
            return Ok(Holding::Held(Mode::Write));
        }
        *crate::mutex::lock(&key.handle::<HolderState>(self.inner.owner).acquired_at) = None;
        Ok(Holding::NotHeld(if was_expired {
            LostReason::Expired
        } else {
            LostReason::Removed
        }))
    }

    /// Deletes each of the holder's slots while it holds the token (compare-and-delete).
    pub(super) async fn sem_delete(&self, key: &Key, permits: Permits) -> Result<bool> {
        if !key.has_token(KIND) || self.sem_name(key.resource()).is_err() {
            return Ok(false);
        }
        let (name, token) = (key.resource().to_owned(), key.token(KIND));
        let wake = Self::sem_wake(&name);
        let state = key.handle::<HolderState>(self.inner.owner);
        *crate::mutex::lock(&state.acquired_at) = None;
        if state.unsent.load(Ordering::Acquire) {
            return Ok(false);
        }
        let release = Run {
            abandon: false,
            ..self.plain()
        };
        let deleted = self
            .run(key.resource(), release, move |mut c| {
                let (name, token) = (name.clone(), token.clone());
                async move {
                    let r =
                        sem_ops::delete_sem_on(&mut c, &name, permits.limit(), token.as_bytes())
                            .await;
                    if r.is_ok() {
                        let record = records::sem_record(&name, token.as_bytes());
                        records::queue(&mut c, &records::delete(&record)).await;
                    }
                    (c, r)
                }
            })
            .await;
        crate::mutex::lock(&self.inner.wakers).notify(&wake);
        deleted
    }

    /// Held while every one of the holder's `count` slots holds its token.
    pub(super) async fn sem_exists(&self, key: &Key, permits: Permits) -> Result<Holding> {
        if !key.has_token(KIND) || self.sem_name(key.resource()).is_err() {
            return Ok(Holding::NotHeld(LostReason::Removed));
        }
        let (name, token) = (key.resource().to_owned(), key.token(KIND));
        let (_, _, mine) = self
            .run(key.resource(), self.plain(), move |mut c| {
                let (name, token) = (name.clone(), token.clone());
                async move {
                    let r =
                        sem_ops::mine_on(&mut c, &name, permits.limit(), token.as_bytes()).await;
                    (c, r)
                }
            })
            .await?;
        Ok(if mine.len() >= permits.count() as usize {
            Holding::Held(Mode::Write)
        } else {
            Holding::NotHeld(LostReason::Removed)
        })
    }

    /// The stored limit and the held slots, grouped by holder.
    pub(super) async fn sem_usage(&self, key: &Key) -> Result<Usage> {
        let name = self.sem_name(key.resource())?;
        let limit = key.permits().map_or(1, Permits::limit);
        let (stored, entries) = self
            .run(key.resource(), self.plain(), move |mut c| {
                let name = name.clone();
                async move {
                    let r = sem_ops::usage_on(&mut c, &name, limit).await;
                    (c, r)
                }
            })
            .await?;
        // token → (slots, the longest ttl left)
        let mut by: BTreeMap<Vec<u8>, (u32, Option<u64>)> = BTreeMap::new();
        for e in entries.into_iter().flatten() {
            let slot = by.entry(e.value).or_default();
            slot.0 += 1;
            slot.1 = slot.1.max(e.ttl);
        }
        let used = by.values().map(|v| v.0).sum();
        let mut found = self
            .sem_records(key.resource(), by.keys())
            .await?
            .into_iter();
        let holders = by
            .into_iter()
            .map(|(token, (n, left))| {
                let record = found.next().flatten();
                let info = HolderInfo::new(Mode::Write, None, left.map(Duration::from_secs))
                    .with_permits(n)
                    .with_record(records::read(record.as_ref(), &token));
                match std::str::from_utf8(&token) {
                    Ok(t) => info.with_token(t),
                    Err(_) => info,
                }
            })
            .collect();
        Ok(Usage {
            used,
            limit: stored.filter(|_| used > 0),
            holders,
        })
    }
}
