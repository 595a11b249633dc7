//! What a [`RedisStore`] tells about its locks beyond one holder's: the holders of a resource
//! with their records, every lock and semaphore under a prefix (`SCAN`), and observers woken
//! on changes.
//!
//! Records (`HolderRecord`'s JSON) are strings at `<prefix>` `0xFF` `xtr-lock:rec:<name>:<token>`,
//! one per holder of ours, written by the save that admits it and expiring with its lease
//! (`scripts.rs`). They are read only for tokens that are live members of the lock's set, so a
//! record is never shown for a holder that no longer holds. Peers' holders have none and show
//! what the set tells (token digest, mode, lease left).

use std::collections::BTreeSet;
use std::time::Duration;

use super::servers::Conn;

use super::RedisStore;
use crate::error::Result;
use crate::key::{Mode, WRITE_MARKER};
use crate::store::{HolderInfo, HolderRecord, Listing, Watcher};

/// Keys asked of the server per `SCAN` call: bounded work per request.
const SCAN_COUNT: usize = 500;

/// How often an observer looks at the lock (the peers poll as often).
const OBSERVE_POLL: Duration = Duration::from_millis(100);

/// How long after a lease's end an observer looks: the server removes what has ended by then.
const OBSERVE_MARGIN: Duration = Duration::from_millis(5);

/// How often an observer that is told of changes looks all the same: what announces nothing
/// beside holders of ours (an older version of this library, whose tokens look like ours; a
/// peer's reader joining ours; a lease shortened by a refresh) is seen within this.
const OBSERVE_QUIET_POLL: Duration = Duration::from_secs(1);

/// An observer's watcher completes after this long even if nothing changed, so it re-reads
/// (spurious completions are allowed; a long wait never rests on one stale snapshot).
const OBSERVE_AT_MOST: Duration = Duration::from_secs(30);

/// A lock's sorted set as read: its members with their scores, the server's time in ms, and
/// the tickets of its wait queue, first first.
struct LockSet {
    members: Vec<(String, f64)>,
    now_ms: u64,
    queue: Vec<String>,
}

impl LockSet {
    /// Whether every member is a holder's token or the write marker (else the key is not a
    /// lock: an application's sorted set at a resource's name).
    fn is_lock(&self) -> bool {
        self.members
            .iter()
            .all(|(m, _)| m == WRITE_MARKER || looks_like_token(m))
    }

    /// The live holders' tokens, remaining leases and mode.
    fn live(&self) -> Vec<(&str, Duration, Mode)> {
        let writing = self.members.iter().any(|(m, _)| m == WRITE_MARKER);
        let mode = if writing { Mode::Write } else { Mode::Read };
        let now = self.now_ms as f64;
        self.members
            .iter()
            .filter(|(m, s)| m != WRITE_MARKER && *s > now)
            .map(|(m, s)| {
                let left = Duration::from_millis((*s as u64).saturating_sub(self.now_ms));
                (m.as_str(), left, mode)
            })
            .collect()
    }
}

/// The waiters of a wait queue's tickets, in their order (see `queue.rs`): `w` or `r` and the
/// token for a lock's, `s`, the token and `.<permits>` at the end for a semaphore's. Their
/// processes may be gone: a ticket leaves the queue when the next save or release finds that.
pub(super) fn waiting(tickets: &[String]) -> impl Iterator<Item = HolderInfo> + '_ {
    tickets.iter().filter_map(|t| {
        let mode = match t.as_bytes().first()? {
            b'r' => Mode::Read,
            b'w' | b's' => Mode::Write,
            _ => return None,
        };
        let mut holder = HolderInfo::new(mode, None, None).with_token(t.get(1..45)?);
        if t.starts_with('s') {
            let permits = t.rsplit_once('.').and_then(|(_, n)| n.parse().ok());
            holder = holder.with_permits(permits.unwrap_or(1));
        }
        holder.waiting = true;
        Some(holder)
    })
}

/// A token as the peers and this library make them: 32 random bytes in base64 (44 characters).
fn looks_like_token(m: &str) -> bool {
    m.len() == 44
        && m.ends_with('=')
        && m[..43]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// Escapes the glob characters of Redis's `MATCH` (`*?[]\`) so that `text` matches itself.
pub(super) fn glob_escape(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 4);
    for &b in text {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

/// What a key under the store's prefix is, by its name (after the prefix).
#[derive(Debug, PartialEq, Eq)]
enum Named {
    Lock(String),
    /// Symfony's time set `{r}:time` of the semaphore `r`.
    Semaphore(String),
    /// Not listed: our internal keys, Symfony's weight sets, names that are not UTF-8.
    Other,
}

fn classify(rest: &[u8]) -> Named {
    if rest.contains(&0xFF) {
        return Named::Other;
    }
    let Ok(name) = std::str::from_utf8(rest) else {
        return Named::Other;
    };
    if let Some(inner) = name.strip_prefix('{') {
        if let Some(r) = inner.strip_suffix("}:time") {
            return Named::Semaphore(r.to_owned());
        }
        if inner.ends_with("}:weight") {
            return Named::Other;
        }
    }
    Named::Lock(name.to_owned())
}

impl RedisStore {
    /// The records of the holders with `tokens` of the lock (or semaphore time set) at prefix +
    /// `name`, in their order (`None`: no record, a peer's holder).
    pub(super) async fn records(
        &self,
        conn: &mut Conn,
        name: &str,
        tokens: &[&str],
    ) -> redis::RedisResult<Vec<Option<HolderRecord>>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<Vec<u8>> = tokens.iter().map(|t| self.record_key(name, t)).collect();
        let values: Vec<Option<Vec<u8>>> = self
            .read(redis::cmd("MGET").arg(keys).query_async(conn))
            .await?;
        Ok(values
            .into_iter()
            .map(|v| v.and_then(|v| HolderRecord::decode(&v)))
            .collect())
    }

    /// The lock set of `resource`, the server's time and the wait queue, in one round trip.
    async fn lock_set(&self, conn: &mut Conn, resource: &str) -> Result<LockSet> {
        type Reply = (Vec<(String, f64)>, (u64, u64), Vec<String>);
        let (members, time, queue): Reply = self
            .read(
                redis::pipe()
                    .cmd("ZRANGE")
                    .arg(self.key_for(resource))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .cmd("TIME")
                    .cmd("ZRANGE")
                    .arg(self.queue_key(resource))
                    .arg(0)
                    .arg(-1)
                    .query_async(conn),
            )
            .await
            .map_err(|e| self.redis_error(e, Some(resource)))?;
        Ok(LockSet {
            members,
            now_ms: time.0 * 1000 + time.1 / 1000,
            queue,
        })
    }

    /// The live holders of the sorted set at `resource`'s key, with their records.
    pub(super) async fn zset_holders(
        &self,
        conn: &mut Conn,
        resource: &str,
    ) -> Result<Vec<HolderInfo>> {
        let set = self.lock_set(conn, resource).await?;
        self.holders_of(conn, resource, &set).await
    }

    async fn holders_of(
        &self,
        conn: &mut Conn,
        resource: &str,
        set: &LockSet,
    ) -> Result<Vec<HolderInfo>> {
        let live = set.live();
        let tokens: Vec<&str> = live.iter().map(|(t, _, _)| *t).collect();
        let mut records = self
            .records(conn, resource, &tokens)
            .await
            .map_err(|e| self.redis_error(e, Some(resource)))?
            .into_iter();
        Ok(live
            .into_iter()
            .map(|(token, left, mode)| {
                HolderInfo::new(mode, None, Some(left))
                    .with_token(token)
                    .with_record(records.next().flatten())
            })
            .chain(waiting(&set.queue))
            .collect())
    }

    /// Every key of the store whose name (after the store's prefix) starts with `prefix`, and
    /// every semaphore time set whose semaphore's does, without duplicates.
    async fn scan_names(&self, conn: &mut Conn, prefix: &str) -> Result<Vec<Named>> {
        let store = glob_escape(self.prefix().as_bytes());
        let mut patterns = vec![[&store[..], &glob_escape(prefix.as_bytes()), b"*"].concat()];
        if !prefix.is_empty() {
            patterns.push([&store[..], b"\\{", &glob_escape(prefix.as_bytes()), b"*"].concat());
        }
        let mut keys = BTreeSet::new();
        // Every master of a cluster holds its own slots' keys; one server is one "master".
        let nodes = self
            .read(conn.masters())
            .await
            .map_err(|e| self.redis_error(e, None))?;
        for (host, port) in &nodes {
            for pattern in &patterns {
                let mut cursor: u64 = 0;
                loop {
                    let mut scan = redis::cmd("SCAN");
                    scan.arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(SCAN_COUNT);
                    let (next, batch): (u64, Vec<Vec<u8>>) = self
                        .read(async {
                            redis::from_redis_value(conn.on_node(scan, host, *port).await?)
                                .map_err(Into::into)
                        })
                        .await
                        .map_err(|e| self.redis_error(e, None))?;
                    keys.extend(batch);
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
        }
        let skip = self.prefix().len();
        Ok(keys
            .into_iter()
            .map(|k| classify(k.get(skip..).unwrap_or_default()))
            .filter(|n| match n {
                Named::Lock(r) | Named::Semaphore(r) => r.starts_with(prefix),
                Named::Other => false,
            })
            .collect())
    }

    /// The keys of `names` that are sorted sets (one pipeline): locks and semaphores only,
    /// never an application's string or hash that happens to be under the prefix.
    async fn sorted_sets(&self, conn: &mut Conn, names: Vec<Named>) -> Result<Vec<Named>> {
        if names.is_empty() {
            return Ok(names);
        }
        let key_of = |n: &Named| match n {
            Named::Lock(r) => self.key_for(r),
            Named::Semaphore(r) => self.semaphore_key(r),
            Named::Other => String::new(),
        };
        let kinds: Vec<String> = if conn.is_cluster() {
            // A cluster's pipelines stay in one slot: one request per key.
            let mut kinds = Vec::with_capacity(names.len());
            for n in &names {
                let kind: String = self
                    .read(redis::cmd("TYPE").arg(key_of(n)).query_async(conn))
                    .await
                    .map_err(|e| self.redis_error(e, None))?;
                kinds.push(kind);
            }
            kinds
        } else {
            let mut pipe = redis::pipe();
            for n in &names {
                pipe.cmd("TYPE").arg(key_of(n));
            }
            self.read(pipe.query_async(conn))
                .await
                .map_err(|e| self.redis_error(e, None))?
        };
        Ok(names
            .into_iter()
            .zip(kinds)
            .filter(|(_, kind)| kind == "zset")
            .map(|(n, _)| n)
            .collect())
    }

    /// `Store::list`: every lock and semaphore under `prefix` that somebody holds.
    pub(super) async fn list_held(&self, prefix: &str) -> Result<Vec<Listing>> {
        let mut conn = self.conn().await?;
        let names = self.scan_names(&mut conn, prefix).await?;
        let mut out = Vec::new();
        for named in self.sorted_sets(&mut conn, names).await? {
            let listing = match named {
                Named::Lock(resource) => {
                    let set = self.lock_set(&mut conn, &resource).await?;
                    if !set.is_lock() {
                        continue;
                    }
                    let holders = self.holders_of(&mut conn, &resource, &set).await?;
                    Listing::lock(resource, holders)
                }
                Named::Semaphore(resource) => {
                    let usage = self.semaphore_usage_of(&resource).await?;
                    let mut holders = usage.holders;
                    holders.extend(waiting(&self.semaphore_queue(&mut conn, &resource).await?));
                    Listing::semaphore(resource, usage.limit.unwrap_or(0), holders)
                }
                Named::Other => continue,
            };
            if listing.is_held() {
                out.push(listing);
            }
        }
        Ok(out)
    }

    /// Who holds `resource` now, as tokens and modes (what an observer compares), and, when
    /// every holder is this library's (each announces its changes), how long until the first
    /// lease ends (a holder that died is seen then).
    async fn who_holds(&self, resource: &str) -> Result<(Vec<(String, bool)>, Option<Duration>)> {
        let mut conn = self.conn().await.map_err(|e| e.with_resource(resource))?;
        let set = self.lock_set(&mut conn, resource).await?;
        let live = set.live();
        let quiet = live
            .iter()
            .all(|(t, _, _)| t.ends_with(crate::key::ANNOUNCING_SUFFIX))
            .then(|| live.iter().map(|(_, left, _)| *left).min())
            .flatten();
        let mut who: Vec<(String, bool)> = live
            .into_iter()
            .map(|(t, _, m)| (t.to_owned(), m == Mode::Write))
            .collect();
        who.sort();
        Ok((who, quiet))
    }

    /// `Store::watch_changes`: a watcher that completes when who holds `resource` changed (an
    /// acquisition, a release, an expiry), after [`OBSERVE_AT_MOST`], or at an error. This
    /// library's changes are announced to it at once (`observers.rs`); while only holders of
    /// ours hold, it looks again at the first lease's end (a holder that died) or after
    /// [`OBSERVE_QUIET_POLL`], whichever comes first, and every [`OBSERVE_POLL`] while the lock
    /// is free or a peer holds it (peers announce nothing). It registers nothing on the server
    /// and takes no place in the wait queue.
    pub(super) async fn observe(&self, resource: &str) -> Result<Option<Watcher>> {
        // Told before the first look, so a change right after it is not missed.
        let mut told = self
            .inner
            .notifier
            .observe_changes(self, &self.key_for(resource))
            .await;
        let (seen, mut quiet) = self.who_holds(resource).await?;
        let store = self.clone();
        let resource = resource.to_owned();
        Ok(Some(Watcher::best_effort(async move {
            let started = tokio::time::Instant::now();
            while started.elapsed() < OBSERVE_AT_MOST {
                let pause = match (&told, quiet) {
                    (Some(_), Some(left)) => (left + OBSERVE_MARGIN).min(OBSERVE_QUIET_POLL),
                    (Some(_), None) | (None, _) => OBSERVE_POLL,
                };
                let pause = pause.min(OBSERVE_AT_MOST.saturating_sub(started.elapsed()));
                tokio::select! {
                    changed = async { told.as_mut().expect("guarded").changed().await },
                        if told.is_some() => {
                        if changed.is_err() {
                            told = None; // the connection went: look, and poll from now on
                        }
                    }
                    () = tokio::time::sleep(pause) => {}
                }
                match store.who_holds(&resource).await {
                    Ok((now, left)) if now == seen => quiet = left,
                    _ => return,
                }
            }
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_match_themselves() {
        assert_eq!(glob_escape(br"a*?[x]\b"), br"a\*\?\[x\]\\b".to_vec());
        assert_eq!(glob_escape(b"plain:%_"), b"plain:%_".to_vec());
    }

    #[test]
    fn keys_are_named_by_their_layout() {
        assert_eq!(classify(b"job:1"), Named::Lock("job:1".into()));
        assert_eq!(classify(b"{s}:time"), Named::Semaphore("s".into()));
        assert_eq!(classify(b"{s}:weight"), Named::Other);
        assert_eq!(classify(b"\xffxtr-lock:fence"), Named::Other);
        assert_eq!(classify(b"\xfe\xfd"), Named::Other);
    }

    #[test]
    fn tokens_are_recognised() {
        let token = format!("{}=", "A".repeat(43));
        assert!(looks_like_token(&token));
        assert!(!looks_like_token("player-1"));
    }
}
