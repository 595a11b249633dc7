//! Counting semaphores on [`RedisStore`], in Symfony Semaphore 5.4's layout, so PHP holders
//! and ours count together (see `semaphore_scripts.rs` and `docs/semaphores.md`).
//!
//! A semaphore `r` is apart from the lock `r`: its keys are `<prefix>{r}:time` and
//! `<prefix>{r}:weight` (Symfony's), our stored limit and its wait queue at keys no resource
//! can name (`<prefix>` `0xFF` `xtr-lock:limit:{r}`, `… queue:{r}:time`). Waiters are woken
//! through the lock's wake channel and queue machinery (`notify.rs`), with tickets that carry
//! the permits they wait for.

use std::time::{Duration, SystemTime};

use super::RedisStore;
use super::conn::Call;
use super::servers::Conn;
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::permits::Permits;
use crate::store::{
    Conflict, HolderInfo, Holding, LostReason, Saved, Usage, Watcher, check_expiry,
};

/// What a semaphore script's reply code means for the holder.
fn holding(code: i64) -> Holding {
    match code {
        2 => Holding::Held(Mode::Write),
        -1 => Holding::NotHeld(LostReason::Expired),
        _ => Holding::NotHeld(LostReason::Removed),
    }
}

impl RedisStore {
    /// Symfony's time set of the semaphore `resource`: `<prefix>{<resource>}:time`. Also the
    /// name the wake machinery knows the semaphore by.
    pub fn semaphore_key(&self, resource: &str) -> String {
        format!("{}{{{resource}}}:time", self.prefix())
    }

    /// The semaphore whose time set is `time_key`, if it is one.
    pub(super) fn semaphore_of(&self, time_key: &str) -> Option<String> {
        let tagged = time_key.strip_prefix(self.prefix())?;
        let inner = tagged.strip_prefix('{')?.strip_suffix("}:time")?;
        Some(inner.to_owned())
    }

    /// The keys every semaphore script takes (see `semaphore_scripts.rs`), `token`'s record
    /// last.
    fn semaphore_keys(&self, resource: &str, token: &str) -> Vec<Vec<u8>> {
        let time = self.semaphore_key(resource);
        let queue = self.queue_key_of(&time);
        let record = self.semaphore_record_key(resource, token);
        let limit = self.companion(&time, &format!("limit:{{{resource}}}"));
        let fence = self.fence_key(&time);
        vec![
            time.into_bytes(),
            format!("{}{{{resource}}}:weight", self.prefix()).into_bytes(),
            limit,
            fence,
            queue,
            record,
        ]
    }

    /// On a cluster, Symfony's two keys of the semaphore `resource` must share a slot: not so
    /// for a name that is empty or starts with `}` (under a prefix without a tag), whose
    /// `{…}` is empty and makes Redis hash each whole key.
    fn one_slot(&self, resource: &str) -> Result<()> {
        let time = self.semaphore_key(resource);
        let weight = format!("{}{{{resource}}}:weight", self.prefix());
        let slot = super::layout::slot_of;
        if !self.inner.layout.is_slotted() || slot(time.as_bytes()) == slot(weight.as_bytes()) {
            return Ok(());
        }
        Err(Error::invalid_argument(
            "on a Redis Cluster a semaphore's name may not be empty or start with '}': \
             Symfony's keys {name}:time and {name}:weight would land in different hash slots",
        )
        .with_resource(resource)
        .with_store(self))
    }

    /// The record of the permits `token` holds on the semaphore `resource`.
    pub(super) fn semaphore_record_key(&self, resource: &str, token: &str) -> Vec<u8> {
        self.record_key(&format!("{{{resource}}}:time"), token)
    }

    fn call<'a>(&self, key: &Key, read_only: bool, ticket: Option<(&'a str, u64)>) -> Call<'a> {
        let (limit, count) = key.permits().map_or((String::new(), String::new()), |p| {
            (p.limit().to_string(), p.count().to_string())
        });
        Call {
            keys: self.semaphore_keys(key.resource(), &key.token(super::KIND)),
            read_only,
            ticket,
            extra: vec![limit, count, super::conn::meta_arg(key)],
        }
    }

    /// One round trip: prune, check the limit, leave earlier waiters their permits, admit.
    pub(super) async fn semaphore_save(
        &self,
        key: &Key,
        permits: Permits,
        ttl: Option<Duration>,
    ) -> Result<Saved> {
        let ttl = self.ttl(key, ttl)?;
        self.one_slot(key.resource())?;
        key.reduce_lifetime(ttl);
        let time_key = self.semaphore_key(key.resource());
        let suffix = format!(".{}", permits.count());
        let ticket = self
            .inner
            .notifier
            .ticket_tagged(&time_key, key, 's', &suffix);
        let call = self.call(
            key,
            false,
            ticket.as_ref().map(|t| (t.text.as_str(), t.since_us)),
        );
        let ((granted, value, announced), confirmed): ((i64, i64, i64), bool) = self
            .eval_durable(&self.inner.sem.save, key, Some(ttl), call)
            .await?;
        if let Some(ticket) = &ticket {
            self.inner
                .notifier
                .answered(self, ticket, granted == 1, announced == 1);
        }
        match granted {
            1 => self.admitted(key, confirmed, value).await,
            -2 => {
                let stored = u32::try_from(value).unwrap_or(u32::MAX);
                Err(permits
                    .limit_mismatch(key.resource(), stored)
                    .with_store(self))
            }
            -3 => {
                let held = u32::try_from(value).unwrap_or(u32::MAX);
                Err(permits.count_changed(key.resource(), held).with_store(self))
            }
            _ => Ok(Saved::Conflict(match u64::try_from(value) {
                Ok(ms) if ms > 0 => Conflict::new().with_retry_after(Duration::from_millis(ms)),
                _ => Conflict::new(),
            })),
        }
    }

    /// One round trip; an ended lease is removed, never revived.
    pub(super) async fn semaphore_put_off(&self, key: &Key, ttl: Duration) -> Result<Holding> {
        key.reduce_lifetime(ttl);
        let call = self.call(key, false, None);
        let (code, confirmed): (i64, bool) = self
            .eval_durable(&self.inner.sem.put_off, key, Some(ttl), call)
            .await?;
        let held = holding(code);
        if held.is_held() {
            if !confirmed {
                return Err(self.unconfirmed(key));
            }
            check_expiry(self, key).await?;
        }
        Ok(held)
    }

    /// One round trip; `true` only if a live lease was removed. Wakes the waiters that fit.
    pub(super) async fn semaphore_delete(&self, key: &Key) -> Result<bool> {
        let call = self.call(key, false, None);
        let removed: i64 = self
            .eval_call(&self.inner.sem.delete, key, None, call)
            .await?;
        Ok(removed == 1)
    }

    /// Read-only (a `no-writes` script on Redis ≥ 7, the same body without the flag before).
    pub(super) async fn semaphore_exists(&self, key: &Key) -> Result<Holding> {
        let code: i64 = self
            .read_only_script(
                &self.inner.sem.exists,
                &self.inner.sem.exists_legacy,
                key,
                || self.call(key, true, None),
            )
            .await?;
        Ok(holding(code))
    }

    /// Registers the holder as a waiter on the semaphore: its next refused save queues it.
    pub(super) async fn semaphore_watch(
        &self,
        key: &Key,
        waiting_since: SystemTime,
    ) -> Result<Option<Watcher>> {
        let time_key = self.semaphore_key(key.resource());
        Ok(self
            .inner
            .notifier
            .watch(self, time_key, key, waiting_since)
            .await)
    }

    /// A waiter's ticket leaves the queue of the semaphore at `time_key`, waking who now fits
    /// (in the background; from a dropped watcher).
    pub(super) fn semaphore_leave(&self, time_key: &str, ticket: String) {
        let Some(resource) = self.semaphore_of(time_key) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            let key = Key::new(resource);
            // A ticket left behind keeps its permits from the waiters after it for as long as
            // this process listens: try again a few times before giving up.
            let mut pause = std::time::Duration::from_millis(100);
            for attempt in 1..=5 {
                let mut call = store.call(&key, false, Some((ticket.as_str(), 0)));
                call.extra = vec![String::new(), String::new()];
                let left: Result<i64> = store
                    .eval_call(&store.inner.sem.leave, &key, None, call)
                    .await;
                match left {
                    Ok(_) => return,
                    Err(err) if attempt == 5 => {
                        tracing::warn!(target: crate::logging::TARGET, resource = key.resource(),
                            error = %err, "cannot take a semaphore waiter out of the queue; its \
                            ticket goes when this process is gone or the queue expires");
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause *= 2;
                    }
                }
            }
        });
    }

    /// The permits held, the stored limit (while anybody holds) and the holders, from both
    /// sets and the server's clock, in one pipeline.
    pub(super) async fn semaphore_usage(&self, key: &Key) -> Result<Usage> {
        self.semaphore_usage_of(key.resource()).await
    }

    /// [`semaphore_usage`](Self::semaphore_usage) of the semaphore `resource`, with the
    /// holders' records.
    /// The tickets of the waiters queued for `resource`'s permits, first first.
    pub(super) async fn semaphore_queue(
        &self,
        conn: &mut Conn,
        resource: &str,
    ) -> Result<Vec<String>> {
        let queue = self.queue_key_of(&self.semaphore_key(resource));
        self.read(
            redis::cmd("ZRANGE")
                .arg(queue)
                .arg(0)
                .arg(-1)
                .query_async(conn),
        )
        .await
        .map_err(|e| self.redis_error(e, Some(resource)))
    }

    pub(super) async fn semaphore_usage_of(&self, resource: &str) -> Result<Usage> {
        let mut conn = self.conn().await.map_err(|e| e.with_resource(resource))?;
        let keys = self.semaphore_keys(resource, "");
        type Reply = (
            Vec<(String, f64)>,
            Vec<(String, f64)>,
            Option<u32>,
            (u64, u64),
        );
        let (times, weights, limit, time): Reply = self
            .read(
                redis::pipe()
                    .cmd("ZRANGE")
                    .arg(&keys[0])
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .cmd("ZRANGE")
                    .arg(&keys[1])
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .cmd("GET")
                    .arg(&keys[2])
                    .cmd("TIME")
                    .query_async(&mut conn),
            )
            .await
            .map_err(|e| self.redis_error(e, Some(resource)))?;
        let now_ms = (time.0 * 1000 + time.1 / 1000) as f64;
        let mut usage = Usage::default();
        let mut live = Vec::new();
        for (token, weight) in &weights {
            let Some((_, ends)) = times.iter().find(|(t, _)| t == token) else {
                continue;
            };
            let ends_ms = ends * 1000.0;
            if ends_ms <= now_ms {
                continue;
            }
            // Weights are whole permits (Symfony's too); anything else counts as its floor.
            let permits = weight.max(0.0) as u32;
            usage.used = usage.used.saturating_add(permits);
            let left = Duration::from_millis((ends_ms - now_ms) as u64);
            live.push((token.as_str(), left, permits));
        }
        let tokens: Vec<&str> = live.iter().map(|(t, _, _)| *t).collect();
        let records = self
            .records(&mut conn, &format!("{{{resource}}}:time"), &tokens)
            .await
            .map_err(|e| self.redis_error(e, Some(resource)))?;
        for ((token, left, permits), record) in live.into_iter().zip(records) {
            usage.holders.push(
                HolderInfo::new(Mode::Write, None, Some(left))
                    .with_token(token)
                    .with_permits(permits)
                    .with_record(record),
            );
        }
        if !usage.holders.is_empty() {
            usage.limit = limit;
        }
        Ok(usage)
    }
}

/// Refuses a semaphore key where only locks go (`save_read`).
pub(super) fn no_shared_permits(store: &RedisStore, key: &Key) -> Error {
    Error::invalid_argument("a semaphore's permits are taken with save, never as a read lock")
        .with_resource(key.resource())
        .with_store(store)
}
