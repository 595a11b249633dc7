//! What stores answer: outcomes are values ("held by someone else" is not an error), failures
//! are [`Error`](crate::Error)s.

use std::time::{Duration, SystemTime};

use crate::error::LostReason;
use crate::key::Mode;

/// What a save (or a native wait) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a save may have been refused"]
pub enum Saved {
    /// The holder now holds the lock in the mode it asked for.
    Acquired(Acquired),
    /// Someone else holds an incompatible lock; nothing new was stored.
    Conflict(Conflict),
}

impl Saved {
    /// Whether the lock was taken.
    pub fn is_acquired(&self) -> bool {
        matches!(self, Saved::Acquired(_))
    }

    /// Whether the attempt was refused because someone else holds the lock.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Saved::Conflict(_))
    }

    /// The acquisition, if the lock was taken.
    pub fn acquired(self) -> Option<Acquired> {
        match self {
            Saved::Acquired(a) => Some(a),
            Saved::Conflict(_) => None,
        }
    }

    /// The refusal, if the lock was held by someone else.
    pub fn conflict(self) -> Option<Conflict> {
        match self {
            Saved::Conflict(c) => Some(c),
            Saved::Acquired(_) => None,
        }
    }
}

/// What a successful save reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Acquired {
    /// The fencing token of this exclusive acquisition, where the store gives one. A re-save by
    /// the holder that already writes keeps its token (the store may then report none).
    pub fencing_token: Option<u64>,
}

impl Acquired {
    /// An acquisition without a fencing token.
    pub fn new() -> Self {
        Acquired::default()
    }

    /// An acquisition with a fencing token.
    pub fn fenced(token: u64) -> Self {
        Acquired {
            fencing_token: Some(token),
        }
    }
}

/// A refused attempt: someone else holds the lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Conflict {
    /// When the current holders' leases end at the latest, where the store knows: a waiter
    /// tries again no later than that.
    pub retry_after: Option<Duration>,
    /// What this holder still holds after the refusal: `Some(Read)` for a reader whose promotion
    /// was refused (it keeps its read lock), `None` when it holds nothing (it never held, or a
    /// store that cannot change a lock's mode atomically lost the old lock on the way).
    pub kept: Option<Mode>,
}

impl Conflict {
    /// A refusal with nothing kept and no hint.
    pub fn new() -> Self {
        Conflict::default()
    }

    /// Says when the current holders' leases end.
    pub fn with_retry_after(mut self, d: Duration) -> Self {
        self.retry_after = Some(d);
        self
    }

    /// Says what the holder still holds.
    pub fn with_kept(mut self, kept: Option<Mode>) -> Self {
        self.kept = kept;
        self
    }
}

impl From<Conflict> for Saved {
    fn from(c: Conflict) -> Saved {
        Saved::Conflict(c)
    }
}

impl From<Acquired> for Saved {
    fn from(a: Acquired) -> Saved {
        Saved::Acquired(a)
    }
}

/// Whether a holder holds its resource, as a store found it ([`Store::exists`],
/// [`Store::put_off_expiration`]).
///
/// `#[must_use]`: a renewal that finds nothing held has not renewed anything.
///
/// ```compile_fail
/// # #![deny(unused_must_use)]
/// # async fn renew(store: &dyn xtr_lock::Store, key: &xtr_lock::Key) -> xtr_lock::Result<()> {
/// store.put_off_expiration(key, std::time::Duration::from_secs(30)).await?; // unused `Holding`
/// # Ok(()) }
/// ```
///
/// [`Store::exists`]: crate::Store::exists
/// [`Store::put_off_expiration`]: crate::Store::put_off_expiration
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refresh or check can find the lock no longer held (Holding::NotHeld)"]
pub enum Holding {
    /// It holds, in this mode.
    Held(Mode),
    /// It holds nothing. The reason is the store's account of how a lock this holder held would
    /// have gone; it only means something to a holder that believed it held.
    NotHeld(LostReason),
}

impl Holding {
    /// The mode held, if any.
    pub fn mode(self) -> Option<Mode> {
        match self {
            Holding::Held(m) => Some(m),
            Holding::NotHeld(_) => None,
        }
    }

    /// Whether it holds, in either mode.
    pub fn is_held(self) -> bool {
        matches!(self, Holding::Held(_))
    }
}

/// Someone holding a resource, as far as the store can tell (see
/// [`Store::holders`](crate::Store::holders)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The mode it holds the resource in.
    pub mode: Mode,
    /// The process holding it, when the store knows (flock: from `/proc/locks`).
    pub pid: Option<u32>,
    /// The lifetime left, on stores with expiry.
    pub remaining: Option<Duration>,
    /// Which holder it is, where the store knows its token: 12 hex digits of the token's
    /// SHA-256, the same in every store of one kind (a Redis quorum's members agree on it) and
    /// safe to show, since it does not give the token away.
    /// [`Key::holder_id`](crate::Key::holder_id) gives a key's.
    pub id: Option<String>,
    /// Which server-side session holds it, where the lock is a database session's (the
    /// advisory store: `backend 4242 (app, from 10.0.0.7)`).
    pub backend: Option<String>,
    /// It does not hold yet: it waits in the store's queue (etcd shows its queue in order).
    pub waiting: bool,
    /// How many permits it holds, for a semaphore's holder ([`Store::usage`](crate::Store::usage)).
    pub permits: Option<u32>,
    /// The metadata it carries ([`Key::set_meta`](crate::Key::set_meta)), where the store keeps
    /// it ([`Capabilities::metadata`](crate::store::Capabilities::metadata)).
    pub meta: Option<Vec<u8>>,
    /// When it acquired, where the store keeps it (the metadata's record).
    pub acquired_at: Option<SystemTime>,
    /// The fencing token of its acquisition, where the store fences and keeps it.
    pub fencing_token: Option<u64>,
}

impl HolderInfo {
    /// A holder in `mode`.
    pub fn new(mode: Mode, pid: Option<u32>, remaining: Option<Duration>) -> Self {
        HolderInfo {
            mode,
            pid,
            remaining,
            id: None,
            backend: None,
            waiting: false,
            permits: None,
            meta: None,
            acquired_at: None,
            fencing_token: None,
        }
    }

    /// What the store's [`HolderRecord`](crate::store::HolderRecord) of this holder says: its
    /// metadata, when it acquired, its fencing token (each kept where the record has none of
    /// its own).
    pub fn with_record(mut self, record: Option<crate::meta::HolderRecord>) -> Self {
        if let Some(r) = record {
            self.meta = r.meta.or(self.meta);
            self.acquired_at = Some(r.acquired_at);
            self.fencing_token = r.fencing_token.or(self.fencing_token);
        }
        self
    }

    /// Its fencing token (sets [`fencing_token`](HolderInfo::fencing_token)).
    pub fn with_fencing_token(mut self, token: u64) -> Self {
        self.fencing_token = Some(token);
        self
    }

    /// How long it has held at `now`, where the store keeps when it acquired.
    pub fn held_for(&self, now: SystemTime) -> Option<Duration> {
        self.acquired_at
            .map(|at| now.duration_since(at).unwrap_or_default())
    }

    /// A semaphore's holder of `permits` permits (sets [`permits`](HolderInfo::permits)).
    pub fn with_permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// Marks it as waiting in the store's queue (sets [`waiting`](HolderInfo::waiting)).
    pub fn queued(mut self) -> Self {
        self.waiting = true;
        self
    }

    /// The server-side session that holds it (sets [`backend`](HolderInfo::backend)).
    pub fn with_backend(mut self, backend: impl Into<String>) -> Self {
        self.backend = Some(backend.into());
        self
    }

    /// The holder whose token is `token` (sets [`id`](HolderInfo::id) to its digest).
    pub fn with_token(mut self, token: &str) -> Self {
        self.id = Some(crate::key::token_id(token));
        self
    }
}

/// What a store answers about a semaphore ([`Store::usage`](crate::Store::usage)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// Permits held now, by every holder the store can see.
    pub used: u32,
    /// The limit its holders agreed on, where the store keeps one (`None` when nobody holds, or
    /// the layout has no place for it).
    pub limit: Option<u32>,
    /// Who holds permits, with how many each ([`HolderInfo::permits`](HolderInfo::permits)).
    pub holders: Vec<HolderInfo>,
}

impl Usage {
    /// Permits free now for a holder that uses `limit` (never below zero).
    pub fn free(&self, limit: u32) -> u32 {
        self.limit.unwrap_or(limit).saturating_sub(self.used)
    }
}

/// One resource somebody holds, as [`Store::list`](crate::Store::list) found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listing {
    /// The resource (the name locks and semaphores are created with).
    pub resource: String,
    /// `Some(limit)` for a counting semaphore (the limit its holders use, `0` where the store
    /// keeps none), `None` for a lock.
    pub semaphore: Option<u32>,
    /// Who holds it, and who waits where the store keeps a queue
    /// ([`HolderInfo::waiting`]), each as [`Store::holders`](crate::Store::holders) tells.
    pub holders: Vec<HolderInfo>,
}

impl Listing {
    /// A lock on `resource` held by `holders`.
    pub fn lock(resource: impl Into<String>, holders: Vec<HolderInfo>) -> Self {
        Listing {
            resource: resource.into(),
            semaphore: None,
            holders,
        }
    }

    /// A counting semaphore `resource` of `limit` (`0`: unknown) held by `holders`.
    pub fn semaphore(resource: impl Into<String>, limit: u32, holders: Vec<HolderInfo>) -> Self {
        Listing {
            resource: resource.into(),
            semaphore: Some(limit),
            holders,
        }
    }

    /// Whether anybody holds it (waiters aside).
    pub fn is_held(&self) -> bool {
        self.holders.iter().any(|h| !h.waiting)
    }
}
