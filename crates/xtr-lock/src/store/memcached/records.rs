//! Holder records in Memcached: a companion key per lock holder (`<name>#xtr-holder:<token>`)
//! and per semaphore holder (`<name>:sem:holder:<token>`), holding the holder's token, a
//! newline and its [`HolderRecord`]. Symfony never reads them (it reads the lock's own key
//! only).
//!
//! Memcached has no multi-key atomicity, so a record follows its lock: a lock's is written
//! just before the add (so whoever sees the holder finds its record), deleted again if the add
//! is refused, touched by each refresh, deleted after the release, and read after the lock's
//! entry names its holder. Being the holder's own key, a record is never overwritten or
//! deleted by another holder's save or release. Every write is quiet and pipelined with the
//! request ([`Conn::send_quiet`]): no round trip is added to a save, a refresh or a release;
//! `holders` takes two.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use super::conn::{Conn, Entry};
use super::{HolderState, MemcachedStore};
use crate::error::Result;
use crate::key::{Key, Mode};
use crate::meta::HolderRecord;
use crate::mutex::lock;
use crate::store::HolderInfo;

/// The longest key Memcached keeps.
const MAX_KEY: usize = 250;

/// `key`, or for one too long for Memcached a digest of it in our namespace.
fn fit(key: String) -> String {
    if key.len() <= MAX_KEY {
        return key;
    }
    let sum = Sha256::digest(key.as_bytes());
    format!(
        "xtr-holder#{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sum)
    )
}

/// Whether `name` is one of our record keys' names (a lock of that name would overwrite, and
/// be deleted with, another lock's record).
pub(super) fn is_reserved(name: &str) -> bool {
    name.contains("#xtr-holder") || name.starts_with("xtr-holder#") || name.contains(":sem:holder:")
}

/// The record key of lock `name`'s holder `token`.
pub(super) fn lock_record(name: &str, token: &[u8]) -> String {
    fit(format!(
        "{name}#xtr-holder:{}",
        String::from_utf8_lossy(token)
    ))
}

/// The record key of the semaphore `name`'s holder `token`.
pub(super) fn sem_record(name: &str, token: &[u8]) -> String {
    fit(format!(
        "{name}:sem:holder:{}",
        String::from_utf8_lossy(token)
    ))
}

/// The record of `key`'s holder, which acquired at `at`, as stored: token, newline, record.
fn value(key: &Key, token: &str, at: SystemTime) -> Vec<u8> {
    let record = HolderRecord::new(key.meta().map(|m| m.to_vec()), at);
    format!("{token}\n{}", record.encode()).into_bytes()
}

/// The record in `entry` if it is the one of the holder of `token`.
pub(super) fn read(entry: Option<&Entry>, token: &[u8]) -> Option<HolderRecord> {
    let v = &entry?.value;
    let newline = v.iter().position(|b| *b == b'\n')?;
    (&v[..newline] == token)
        .then(|| HolderRecord::decode(&v[newline + 1..]))
        .flatten()
}

/// The quiet set of a record, for [`Conn::send_quiet`].
pub(super) fn set(record_key: &str, value: &[u8], secs: u64) -> Vec<u8> {
    let mut cmd = format!("ms {record_key} {} T{secs} F0 q\r\n", value.len()).into_bytes();
    cmd.extend_from_slice(value);
    cmd.extend_from_slice(b"\r\n");
    cmd
}

/// The quiet touch of a record (a new ttl, nothing read).
pub(super) fn touch(record_key: &str, secs: u64) -> Vec<u8> {
    format!("mg {record_key} T{secs} q\r\n").into_bytes()
}

/// The quiet delete of a record.
pub(super) fn delete(record_key: &str) -> Vec<u8> {
    format!("md {record_key} q\r\n").into_bytes()
}

/// Sends quiet `commands` behind a request's last reply; a failure to write costs the record
/// only (the connection, broken, is found so by the next request).
pub(super) async fn queue(c: &mut Conn, commands: &[u8]) {
    let _ = c.send_quiet(commands).await;
}

impl MemcachedStore {
    /// The records of a semaphore's holders `tokens`, in their order (one pipelined read; none
    /// without holders).
    pub(super) async fn sem_records<'t>(
        &self,
        resource: &str,
        tokens: impl Iterator<Item = &'t Vec<u8>>,
    ) -> Result<Vec<Option<Entry>>> {
        let keys: Vec<String> = tokens.map(|t| sem_record(resource, t)).collect();
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.run(resource, self.plain(), move |mut c| {
            let keys = keys.clone();
            async move {
                let r = c.get_many(&keys).await;
                (c, r)
            }
        })
        .await
    }

    /// The lock's holder, then its record (two round trips: the record's key is the holder's).
    pub(super) async fn holders_of(&self, resource: &str) -> Result<Vec<HolderInfo>> {
        let name = self.name(resource)?;
        let entries = self
            .run(resource, self.plain(), move |mut c| {
                let name = name.clone();
                async move {
                    let entry = match c.get(&name).await {
                        Ok(entry) => entry,
                        Err(e) => return (c, Err(e)),
                    };
                    // Only a token of ours has a record; anything else at the key (a value
                    // any client wrote) never becomes part of a command.
                    let ours = entry.as_ref().filter(|e| {
                        std::str::from_utf8(&e.value)
                            .is_ok_and(|t| crate::key::validate_token(t).is_ok())
                    });
                    let record = match ours {
                        Some(e) => c.get(&lock_record(&name, &e.value)).await,
                        None => Ok(None),
                    };
                    (c, record.map(|record| (entry, record)))
                }
            })
            .await?;
        let (entry, record) = entries;
        Ok(entry
            .map(|e| {
                let left = e.ttl.map(Duration::from_secs);
                let info = HolderInfo::new(Mode::Write, None, left)
                    .with_record(read(record.as_ref(), &e.value));
                match std::str::from_utf8(&e.value) {
                    Ok(token) => info.with_token(token),
                    Err(_) => info,
                }
            })
            .into_iter()
            .collect())
    }

    /// The quiet set of `key`'s record, acquiring now unless it already holds (a re-save
    /// keeps when it acquired, as this process knows it: a key that travelled here since
    /// counts from its first save here).
    pub(super) fn record_to_set(
        &self,
        key: &Key,
        state: &HolderState,
        record_key: &str,
        token: &str,
        secs: u64,
    ) -> Vec<u8> {
        let at = *lock(&state.acquired_at).get_or_insert_with(SystemTime::now);
        set(record_key, &value(key, token, at), secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_fit_memcached_keys_and_belong_to_their_token() {
        assert_eq!(lock_record("invoice:42", b"t"), "invoice:42#xtr-holder:t");
        let long = "x".repeat(245);
        let k = lock_record(&long, b"t");
        assert!(k.starts_with("xtr-holder#") && k.len() < 60, "{k}");
        assert_ne!(k, lock_record(&"x".repeat(246), b"t"));
        assert_ne!(k, lock_record(&long, b"u"));
        assert!(sem_record(&long, b"t").len() <= MAX_KEY);
        let key = Key::new("r").with_meta(b"m".to_vec()).unwrap();
        let at = std::time::UNIX_EPOCH;
        let entry = Entry {
            value: value(&key, "tok", at),
            cas: 1,
            ttl: None,
        };
        let r = read(Some(&entry), b"tok").unwrap();
        assert_eq!((r.meta.as_deref(), r.acquired_at), (Some(&b"m"[..]), at));
        assert_eq!(read(Some(&entry), b"other"), None, "another holder's");
        assert_eq!(read(None, b"tok"), None);
        let cmd = set("k", b"v", 7);
        assert_eq!(cmd, b"ms k 1 T7 F0 q\r\nv\r\n");
    }
}
