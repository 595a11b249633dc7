//! A semaphore's request sequences on one connection: `limit` slot keys `<name>:sem:<i>`, each
//! taken with an add (value = the holder's token), and the limit in `<name>:sem:limit`. Each
//! sequence reads before it writes, so it can be sent again after a connection was found closed.

use std::io;

use rand::Rng as _;

use super::conn::{Conn, Entry, Stored};
use super::ops::{Found, delete_on, put_off_on, unexpected};
use crate::permits::Permits;

/// How often an admission starts again when the limit changed under it.
const ROUNDS: usize = 5;

/// The longest name a semaphore may have: its keys add `:sem:limit` (Memcached keeps 250 bytes).
pub(super) const MAX_NAME: usize = 250 - ":sem:limit".len();

/// The key of slot `i` of semaphore `name`.
pub(super) fn slot(name: &str, i: u32) -> String {
    format!("{name}:sem:{i}")
}

/// The key of semaphore `name`'s limit.
pub(super) fn limit_key(name: &str) -> String {
    format!("{name}:sem:limit")
}

/// The keys of the first `limit` slots.
pub(super) fn slots(name: &str, limit: u32) -> Vec<String> {
    (0..limit).map(|i| slot(name, i)).collect()
}

/// What an admission did.
pub(super) enum Admit {
    Taken,
    /// Too few slots free: the seconds until the first held one ends, if known.
    Full(Option<u64>),
    /// The holders use another limit (stored).
    Mismatch(u32),
    /// The holder holds this many slots and asked for another count.
    CountChanged(u32),
}

fn parse_limit(e: &Entry) -> io::Result<u32> {
    std::str::from_utf8(&e.value)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "the semaphore's limit key holds something other than a number",
            )
        })
}

/// The stored limit, added as ours when there is none (`None`: it came and went; read again).
async fn stored_limit(c: &mut Conn, name: &str, ours: u32) -> io::Result<Option<(u32, u64)>> {
    let key = limit_key(name);
    if let Some(e) = c.get(&key).await? {
        return Ok(Some((parse_limit(&e)?, e.cas)));
    }
    // Added once, without expiry (0): it must outlive every holder that relies on it.
    match c.add(&key, ours.to_string().as_bytes(), 0).await? {
        Stored::Done => Ok(c.get(&key).await?.map(|e| (ours, e.cas))),
        _ => Ok(None),
    }
}

/// Takes `p.count()` free slots for `token` (or refreshes the ones it holds) under the stored
/// limit; a holder that cannot take them all gives back those it took.
pub(super) async fn admit_on(
    c: &mut Conn,
    name: &str,
    token: &[u8],
    p: Permits,
    secs: u64,
) -> io::Result<Admit> {
    for _ in 0..ROUNDS {
        let Some((stored, cas)) = stored_limit(c, name, p.limit()).await? else {
            continue;
        };
        if stored != p.limit() {
            if change_limit(c, name, token, (stored, cas), p.limit(), secs).await? {
                continue;
            }
            return Ok(Admit::Mismatch(stored));
        }
        let keys = slots(name, p.limit());
        let entries = c.get_many(&keys).await?;
        let mine: Vec<usize> = (0..keys.len())
            .filter(|&i| entries[i].as_ref().is_some_and(|e| e.value == token))
            .collect();
        if mine.len() > p.count() as usize {
            return Ok(Admit::CountChanged(
                u32::try_from(mine.len()).unwrap_or(u32::MAX),
            ));
        }
        if !mine.is_empty() && mine.len() < p.count() as usize {
            // Our own take that did not finish (an error after some adds, on a connection
            // since lost) or a slot evicted: give them back and start over, rather than leave
            // them held by nobody until their ttl.
            give_back(c, &keys, &mine, token).await?;
            continue;
        }
        let need = (p.count() as usize).saturating_sub(mine.len());
        let left = entries.iter().flatten().filter_map(|e| e.ttl).min();
        // The free slots, from a random one on: contenders start apart.
        let mut free: Vec<usize> = (0..keys.len()).filter(|&i| entries[i].is_none()).collect();
        if !free.is_empty() {
            let start = rand::rng().random_range(0..free.len());
            free.rotate_left(start);
        }
        if free.len() < need {
            return Ok(Admit::Full(left));
        }
        let mut taken = Vec::with_capacity(need);
        for &i in &free {
            if taken.len() == need {
                break;
            }
            match c.add(&keys[i], token, secs).await? {
                Stored::Done => taken.push(i),
                Stored::Exists => {}
                other => return Err(unexpected("an add", other)),
            }
        }
        if taken.len() < need {
            give_back(c, &keys, &taken, token).await?;
            return Ok(Admit::Full(left));
        }
        if need > 0 {
            // A holder of another limit may have taken every slot and changed the limit since
            // it was read: then these slots count under a limit that is not ours.
            let now = c.get(&limit_key(name)).await?;
            if now.as_ref().map(parse_limit).transpose()? != Some(p.limit()) {
                give_back(c, &keys, &taken, token).await?;
                continue;
            }
        }
        if !refresh_slots(c, &keys, &mine, &entries, token, secs).await? {
            give_back(c, &keys, &taken, token).await?;
            continue;
        }
        return Ok(Admit::Taken);
    }
    Ok(Admit::Full(None))
}

/// Changes the limit from `stored` to `ours` if nobody holds: takes every slot of the stored
/// limit first (an add fails on a held one), replaces the limit by CAS, gives the slots back.
/// `false`: somebody holds.
async fn change_limit(
    c: &mut Conn,
    name: &str,
    token: &[u8],
    (stored, cas): (u32, u64),
    ours: u32,
    secs: u64,
) -> io::Result<bool> {
    let keys = slots(name, stored);
    let mut taken = Vec::with_capacity(keys.len());
    let mut held = false;
    for (i, key) in keys.iter().enumerate() {
        match c.add(key, token, secs).await? {
            Stored::Done => taken.push(i),
            Stored::Exists => {
                held = true;
                break;
            }
            other => return Err(unexpected("an add", other)),
        }
    }
    if !held {
        // Changed meanwhile (another changer): the caller reads it again either way.
        let _ = c
            .replace_if(&limit_key(name), ours.to_string().as_bytes(), 0, cas)
            .await?;
    }
    give_back(c, &keys, &taken, token).await?;
    Ok(!held)
}

/// Extends the slots `mine` (as `entries` read them) by CAS; whether all are still ours.
async fn refresh_slots(
    c: &mut Conn,
    keys: &[String],
    mine: &[usize],
    entries: &[Option<Entry>],
    token: &[u8],
    secs: u64,
) -> io::Result<bool> {
    for &i in mine {
        let Some(e) = &entries[i] else { continue };
        match c.replace_if(&keys[i], token, secs, e.cas).await? {
            Stored::Done => {}
            // Touched since the read (a refresh of the same holder): read and try again.
            Stored::Changed => {
                if !matches!(put_off_on(c, &keys[i], token, secs).await?, Found::Ours) {
                    return Ok(false);
                }
            }
            Stored::Missing => return Ok(false),
            other => return Err(unexpected("a CAS replace", other)),
        }
    }
    Ok(true)
}

/// Deletes the slots `which` while they hold `token`.
async fn give_back(c: &mut Conn, keys: &[String], which: &[usize], token: &[u8]) -> io::Result<()> {
    for &i in which {
        delete_on(c, &keys[i], token).await?;
    }
    Ok(())
}

/// The slots of `name` (of `limit`) that hold `token`, as read now.
pub(super) async fn mine_on(
    c: &mut Conn,
    name: &str,
    limit: u32,
    token: &[u8],
) -> io::Result<(Vec<String>, Vec<Option<Entry>>, Vec<usize>)> {
    let keys = slots(name, limit);
    let entries = c.get_many(&keys).await?;
    let mine = (0..keys.len())
        .filter(|&i| entries[i].as_ref().is_some_and(|e| e.value == token))
        .collect();
    Ok((keys, entries, mine))
}

/// Extends every slot of the holder; whether it still holds all `count` of them.
pub(super) async fn put_off_sem_on(
    c: &mut Conn,
    name: &str,
    p: Permits,
    token: &[u8],
    secs: u64,
) -> io::Result<bool> {
    let (keys, entries, mine) = mine_on(c, name, p.limit(), token).await?;
    if mine.len() < p.count() as usize {
        return Ok(false);
    }
    refresh_slots(c, &keys, &mine, &entries, token, secs).await
}

/// Deletes every slot of the holder (compare-and-delete each); whether any was live.
pub(super) async fn delete_sem_on(
    c: &mut Conn,
    name: &str,
    limit: u32,
    token: &[u8],
) -> io::Result<bool> {
    let (keys, _, mine) = mine_on(c, name, limit, token).await?;
    let mut any = false;
    for i in mine {
        any |= delete_on(c, &keys[i], token).await?;
    }
    Ok(any)
}

/// The stored limit (if any) and the slots held under it (or under `limit` without one).
pub(super) async fn usage_on(
    c: &mut Conn,
    name: &str,
    limit: u32,
) -> io::Result<(Option<u32>, Vec<Option<Entry>>)> {
    let stored = c
        .get(&limit_key(name))
        .await?
        .map(|e| parse_limit(&e))
        .transpose()?;
    let entries = c.get_many(&slots(name, stored.unwrap_or(limit))).await?;
    Ok((stored, entries))
}
