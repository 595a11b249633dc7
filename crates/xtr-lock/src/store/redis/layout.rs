//! Where a Redis store keeps its own keys (the fencing counter, wait queues, holder records,
//! semaphore limits) and the channel its waiters are woken on.
//!
//! On one server every such key is `<prefix>` `0xFF` `xtr-lock:<name>`: no resource can name it
//! (UTF-8 never holds `0xFF`), and ACL patterns on `<prefix>*` cover it.
//!
//! On a Redis Cluster a script may only touch keys of one hash slot, so each companion key must
//! sit in its resource key's slot, whatever the resource's name. The resource key is never
//! changed (peers share it), so the companion is made to follow it: `<prefix>` `0xFF`
//! `xtr-lock:` then a hash tag chosen from a per-slot table, then the name. The hash-tag rule:
//! a key's slot is CRC16 of the bytes between its first `{` and the first `}` after it when
//! there is at least one; otherwise of the whole key. Three cases, by the prefix:
//!
//! - no `{` in the prefix: we write `{T}`, with `T` from the table of the slot (`T` of at most
//!   four letters or digits whose CRC16 is that slot);
//! - a `{` the prefix leaves open: we close it, writing `T}` where CRC16 of the prefix's text
//!   after its `{`, `0xFF`, `xtr-lock:` and `T` is the slot;
//! - a `{…}` tag closed inside the prefix: it decides every key of the store, ours and the
//!   resources' alike (one slot for all); nothing to add. A prefix whose first braces are empty
//!   (`{}`) makes Redis hash whole keys, which no companion can follow: refused on a cluster.
//!
//! The fencing counter is per slot on a cluster (per store on one server): tokens still rise
//! for every resource, as each resource stays in its slot, and no counter is made per resource.

use std::sync::OnceLock;

use super::{FENCE_KEY, RedisStore};
use crate::error::{Error, Result};

/// What a store's wake channel is called on one server, before its id.
pub(super) const WAKE_CHANNEL: &str = "__xtr_lock__:wake:";

/// What a store's sharded wake channel of a slot is called on a cluster, after the slot's head
/// (see `layout.rs`) and before its id.
pub(super) const SHARDED_WAKE: &[u8] = b"wake:";

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// What follows the prefix in every key of our own.
const OURS: &[u8] = b"\xFFxtr-lock:";

/// The letters a tag is made of (no braces, nothing a glob or a shell cares about).
const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// How companion keys are named.
#[derive(Debug)]
pub(crate) enum Layout {
    /// One server: `<prefix>` `0xFF` `xtr-lock:<name>`.
    Plain { head: Vec<u8> },
    /// A cluster: a tag after the head puts each companion in its resource's slot.
    Slotted(Slotted),
}

#[derive(Debug)]
pub(crate) struct Slotted {
    /// `<prefix>` `0xFF` `xtr-lock:`.
    head: Vec<u8>,
    tags: Tags,
}

#[derive(Debug)]
enum Tags {
    /// The prefix's own tag decides every slot.
    Fixed,
    /// We open and close the tag: `{T}`.
    Open(OnceLock<Box<[[u8; 4]]>>),
    /// The prefix opened it; we close it: `T}`, hashed after `lead` (the head past its `{`).
    Close {
        lead: Vec<u8>,
        table: OnceLock<Box<[[u8; 4]]>>,
    },
}

impl Layout {
    /// The layout of a store on one server.
    pub(crate) fn plain(prefix: &str) -> Layout {
        Layout::Plain { head: head(prefix) }
    }

    /// The layout of a store on a cluster, or why the prefix cannot have one.
    pub(crate) fn slotted(prefix: &str) -> Result<Layout> {
        let head = head(prefix);
        let tags = match head.iter().position(|&b| b == b'{') {
            None => Tags::Open(OnceLock::new()),
            Some(open) => match head[open + 1..].iter().position(|&b| b == b'}') {
                Some(0) => {
                    return Err(Error::invalid_argument(
                        "a key prefix whose first braces are empty (\"{}\") makes a Redis Cluster \
                         hash whole keys, and no key of the store's own can then share a \
                         resource's slot: put something between the braces, or drop them",
                    ));
                }
                Some(_) => Tags::Fixed,
                None => Tags::Close {
                    lead: head[open + 1..].to_vec(),
                    table: OnceLock::new(),
                },
            },
        };
        Ok(Layout::Slotted(Slotted { head, tags }))
    }

    /// Whether companion keys follow their resources' slots.
    pub(crate) fn is_slotted(&self) -> bool {
        matches!(self, Layout::Slotted(_))
    }

    /// The key of our own called `name` that belongs with `anchor` (a resource's key, or a
    /// semaphore's time set): in its slot on a cluster.
    pub(crate) fn companion(&self, anchor: &[u8], name: &str) -> Vec<u8> {
        let mut key = self.slot_head(slot_of(anchor));
        key.extend_from_slice(name.as_bytes());
        key
    }

    /// A key of our own that belongs with no resource (the clock probe's).
    pub(crate) fn loose(&self, name: &str) -> Vec<u8> {
        let head = match self {
            Layout::Plain { head } | Layout::Slotted(Slotted { head, .. }) => head,
        };
        let mut key = head.clone();
        key.extend_from_slice(name.as_bytes());
        key
    }

    /// What every companion key of `slot` starts with (the head, and the slot's tag on a
    /// cluster).
    pub(crate) fn slot_head(&self, slot: u16) -> Vec<u8> {
        match self {
            Layout::Plain { head } => head.clone(),
            Layout::Slotted(s) => s.slot_head(slot),
        }
    }
}

impl Slotted {
    fn slot_head(&self, slot: u16) -> Vec<u8> {
        let mut key = self.head.clone();
        match &self.tags {
            Tags::Fixed => {}
            Tags::Open(table) => {
                key.push(b'{');
                key.extend_from_slice(tag(table.get_or_init(|| build(&[])), slot));
                key.push(b'}');
            }
            Tags::Close { lead, table } => {
                key.extend_from_slice(tag(table.get_or_init(|| build(lead)), slot));
                key.push(b'}');
            }
        }
        key
    }
}

fn head(prefix: &str) -> Vec<u8> {
    let mut head = prefix.as_bytes().to_vec();
    head.extend_from_slice(OURS);
    head
}

/// The tag of `slot` in `table` (its letters, without the zero padding).
fn tag(table: &[[u8; 4]], slot: u16) -> &[u8] {
    let entry = &table[usize::from(slot) % SLOTS];
    let len = entry.iter().position(|&b| b == 0).unwrap_or(4);
    &entry[..len]
}

/// For every slot, the shortest tag `T` (then the first in alphabet order) whose CRC16 after
/// `lead` is that slot. Strings of up to three letters reach every slot for any `lead` seen so
/// far; four are tried for what is left (a test checks the tables are whole).
fn build(lead: &[u8]) -> Box<[[u8; 4]]> {
    let mut table = vec![[0u8; 4]; SLOTS].into_boxed_slice();
    let mut filled = vec![false; SLOTS];
    let mut left = SLOTS;
    let base = crc16_update(0, lead);
    let mut candidate = Vec::with_capacity(4);
    'lengths: for len in 1..=4u32 {
        let count = ALPHABET.len().pow(len);
        for n in 0..count {
            candidate.clear();
            let mut rest = n;
            for _ in 0..len {
                candidate.push(ALPHABET[rest % ALPHABET.len()]);
                rest /= ALPHABET.len();
            }
            let slot = usize::from(crc16_update(base, &candidate)) % SLOTS;
            if !filled[slot] {
                filled[slot] = true;
                table[slot][..candidate.len()].copy_from_slice(&candidate);
                left -= 1;
                if left == 0 {
                    break 'lengths;
                }
            }
        }
    }
    table
}

/// The hash slot of `key` by Redis Cluster's rule (CRC16/XMODEM of the hash tag, or of the
/// whole key, modulo 16384).
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            match rest.iter().position(|&b| b == b'}') {
                Some(0) | None => None,
                Some(close) => Some(&rest[..close]),
            }
        })
        .unwrap_or(key);
    crc16_update(0, hashed) % SLOTS as u16
}

/// CRC16/XMODEM (polynomial 0x1021, no reflection, no final xor), continued from `crc`.
fn crc16_update(mut crc: u16, bytes: &[u8]) -> u16 {
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

impl RedisStore {
    /// The key of our own called `name` that belongs with the key `anchor` (in its slot on a
    /// cluster).
    pub(super) fn companion(&self, anchor: &str, name: &str) -> Vec<u8> {
        self.inner.layout.companion(anchor.as_bytes(), name)
    }

    /// The fencing counter that serves `anchor`'s resource: one per store on one server, one
    /// per hash slot on a cluster.
    pub(super) fn fence_key(&self, anchor: &str) -> Vec<u8> {
        self.companion(anchor, FENCE_KEY)
    }

    /// The record of the holder with `token` of the lock (or semaphore time set) at prefix +
    /// `name`: `rec:<name>:<token>` among our keys (tokens have a fixed length, so two holders
    /// never share one).
    pub(super) fn record_key(&self, name: &str, token: &str) -> Vec<u8> {
        let anchor = format!("{}{name}", self.inner.prefix);
        self.companion(&anchor, &format!("rec:{name}:{token}"))
    }

    /// The wait queue of `resource` (see `docs/waking.md`).
    pub(super) fn queue_key(&self, resource: &str) -> Vec<u8> {
        self.companion(&self.key_for(resource), &format!("queue:{resource}"))
    }

    /// The wait queue of the lock at `lock_key` (prefix + resource).
    pub(super) fn queue_key_of(&self, lock_key: &str) -> Vec<u8> {
        self.queue_key(lock_key.strip_prefix(self.prefix()).unwrap_or(lock_key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_redis_clusters() {
        // The values Redis Cluster's specification gives, and CLUSTER KEYSLOT's.
        assert_eq!(crc16_update(0, b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(
            slot_of(b"foo{}{bar}"),
            crc16_update(0, b"foo{}{bar}") % 16384
        );
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(slot_of(b"foo{bar}{zap}"), slot_of(b"bar"));
    }

    #[test]
    fn every_slot_has_a_tag_whatever_the_prefix() {
        for prefix in ["", "app:", "app{", "{x", "a{b:c"] {
            let Layout::Slotted(s) = Layout::slotted(prefix).unwrap() else {
                unreachable!()
            };
            for slot in 0..SLOTS as u16 {
                let head = s.slot_head(slot);
                assert_eq!(slot_of(&head), slot, "prefix {prefix:?}, slot {slot}");
            }
        }
    }

    #[test]
    fn companions_land_in_their_resources_slot() {
        // Names with braces in every position, under prefixes of every kind.
        let names = [
            "r", "{r}", "a{b}c", "{}", "a{}b", "{", "}", "}{x}", "{{x}}", "a{b", "x}y{z}", "é{ü}",
        ];
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut random = Vec::new();
        for _ in 0..2000 {
            let mut name = String::new();
            for _ in 0..(seed % 9) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                name.push(b"ab{}:x}{"[(seed % 8) as usize] as char);
            }
            random.push(name);
        }
        for prefix in ["", "app:", "app{", "{tenant}:", "t{a", "a}b{c}"] {
            let layout = Layout::slotted(prefix).unwrap();
            for name in names
                .iter()
                .copied()
                .chain(random.iter().map(String::as_str))
            {
                let key = format!("{prefix}{name}");
                let companion = layout.companion(key.as_bytes(), &format!("queue:{name}"));
                assert_eq!(
                    slot_of(&companion),
                    slot_of(key.as_bytes()),
                    "prefix {prefix:?}, name {name:?}"
                );
            }
        }
    }

    #[test]
    fn empty_braces_in_the_prefix_are_refused_on_a_cluster() {
        let err = Layout::slotted("a{}b").unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        Layout::plain("a{}b");
    }

    #[test]
    fn one_server_keeps_the_plain_layout() {
        let layout = Layout::plain("app:");
        assert_eq!(
            layout.companion(b"app:r", "fence"),
            b"app:\xFFxtr-lock:fence"
        );
        assert!(!layout.is_slotted());
    }
}
