//! [`Election`]: one leader among candidates, fenced and observable, built on a lock: the
//! leader is the holder of the lock named after the election, its value is the holder's
//! metadata, its term the acquisition's fencing token.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::lock::factory::LockFactory;
use crate::lock::lockable::{Lockable as _, Release};
use crate::lock::lost::LockLost;
use crate::mutex::lock as locked;
use crate::store::HolderInfo;

mod candidate;
mod observe;

use candidate::Inner;

pub use observe::Observer;

/// An election among candidates for `name`: at most one leads at a time, in every process that
/// uses the same store and name. Each `Election` is one candidate (clones share it).
///
/// A candidate [campaigns](Election::campaign) with a value (who it is: a host, an address) and
/// waits until it leads; it leads as long as it holds the election's lock, which is kept alive
/// in the background, and stops leading when it [resigns](Election::resign), when the lock is
/// lost (reported by [`Leadership::lost`] and [`is_leader`](Election::is_leader), with why),
/// or when the `Election` is dropped. Anyone can ask [who leads](Election::leader) and
/// [observe](Election::observe) every change.
///
/// - **Term**: the leader's fencing token on stores that fence
///   ([`Capabilities::fencing`](crate::store::Capabilities::fencing)): every later leader's is
///   larger, so a resource that remembers the largest term it saw refuses a deposed leader.
/// - **Value**: the candidate's metadata ([`Key::set_meta`](crate::Key::set_meta)), shown on
///   stores that keep it ([`Capabilities::metadata`](crate::store::Capabilities::metadata)); on
///   etcd it is the value of the election key, as Go's `concurrency.Election` and
///   `etcdctl elect` write it, so both sides see each other's candidates.
/// - **Re-campaign**: by default a lost leadership stays lost (the program decides);
///   [`with_recampaign(true)`](Election::with_recampaign) campaigns again at once, with the same
///   value, so a standby keeps standing by.
///
/// See `docs/election.md` for what a leader may assume on each store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> xtr_lock::Result<()> {
/// let factory = xtr_lock::LockFactory::new(xtr_lock::InMemoryStore::new());
/// let (a, b) = (factory.create_election("scheduler"), factory.create_election("scheduler"));
/// let leading = a.campaign("host-a").await?;
/// assert!(*a.is_leader().borrow());
/// let leader = b.leader().await?.expect("a leads");
/// assert_eq!(leader.value.as_deref(), Some(&b"host-a"[..]));
/// assert_eq!(leader.term, leading.term());
/// let _ = a.resign().await?;
/// assert!(b.leader().await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

/// This candidate's leadership, from [`Election::campaign`].
#[derive(Clone)]
pub struct Leadership {
    term: Option<u64>,
    since: SystemTime,
    lost: watch::Receiver<Option<LockLost>>,
}

impl Leadership {
    /// The term: the fencing token of the acquisition, on stores that fence.
    pub fn term(&self) -> Option<u64> {
        self.term
    }

    /// When this candidate began to lead (this machine's clock).
    pub fn since(&self) -> SystemTime {
        self.since
    }

    /// Completes when this leadership is lost, with why; pending forever after a resignation
    /// or once the candidate is dropped (see [`ended`](Leadership::ended)).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a later call reports the same loss.
    pub fn lost(&self) -> impl Future<Output = LockLost> + Send + 'static {
        let mut rx = self.lost.clone();
        async move {
            loop {
                if let Some(lost) = rx.borrow_and_update().clone() {
                    return lost;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// Completes when this leadership ends, whatever ended it: `Some(loss)` for a loss (as
    /// [`lost`](Leadership::lost)), `None` for a resignation or the candidate dropped. For
    /// work that must stop with the leadership, wherever it is ended from.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a later call reports the same end.
    pub fn ended(&self) -> impl Future<Output = Option<LockLost>> + Send + 'static {
        let mut rx = self.lost.clone();
        async move {
            loop {
                if let Some(lost) = rx.borrow_and_update().clone() {
                    return Some(lost);
                }
                if rx.changed().await.is_err() {
                    return rx.borrow().clone();
                }
            }
        }
    }

    /// The loss, if this leadership has been lost (no waiting).
    pub fn lost_now(&self) -> Option<LockLost> {
        self.lost.borrow().clone()
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("term", &self.term)
            .field("since", &self.since)
            .field("lost", &self.lost_now().map(|l| l.reason))
            .finish()
    }
}

/// Who leads, as the store tells ([`Election::leader`], [`Observer::next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's value (its candidate's metadata), where the store keeps it.
    pub value: Option<Vec<u8>>,
    /// Its term (fencing token), on stores that fence.
    pub term: Option<u64>,
    /// Since when it leads, where the store keeps it.
    pub since: Option<SystemTime>,
    /// Which holder it is ([`HolderInfo::id`]).
    pub id: Option<String>,
    /// Its process, where the store knows.
    pub pid: Option<u32>,
    /// How long its lease lasts if it goes silent now, on stores with expiry.
    pub remaining: Option<Duration>,
}

impl Leader {
    fn from_holder(h: HolderInfo) -> Self {
        Leader {
            value: h.meta,
            term: h.fencing_token,
            since: h.acquired_at,
            id: h.id,
            pid: h.pid,
            remaining: h.remaining,
        }
    }

    /// The value as text (invalid UTF-8 replaced), empty without one.
    pub fn value_lossy(&self) -> String {
        String::from_utf8_lossy(self.value.as_deref().unwrap_or_default()).into_owned()
    }

    /// Whether `other` is the same leadership (same holder, term and value; the lease left
    /// may differ).
    pub fn same_as(&self, other: &Leader) -> bool {
        (&self.id, self.term, &self.value) == (&other.id, other.term, &other.value)
    }
}

impl LockFactory {
    /// A candidate in the election `name`, with the factory's store, clock and ttl (the ttl is
    /// the leader's lease on expiring stores: a leader that stops renewing is replaced after
    /// it).
    pub fn create_election(&self, name: impl Into<String>) -> Election {
        Election {
            inner: Arc::new(Inner::new(self.clone(), name.into())),
        }
    }
}

impl Election {
    /// The election's name (the resource of its lock).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Campaigns again at once, with the same value, after leadership is lost (not after a
    /// resignation). Applies to this candidate (and its clones), from its next loss on.
    #[must_use]
    pub fn with_recampaign(self, on: bool) -> Self {
        self.set_recampaign(on);
        self
    }

    /// Like [`with_recampaign`](Election::with_recampaign), on a shared candidate.
    pub fn set_recampaign(&self, on: bool) {
        self.inner.recampaign.store(on, Ordering::Relaxed);
    }

    /// Waits until this candidate leads, with `value` as its metadata (at most
    /// [`MAX_META`](crate::MAX_META) bytes; never a credential: anyone can read it). Returns at
    /// once when it already leads with that value.
    ///
    /// # Errors
    ///
    /// A store failure, as the lock's acquire; an invalid argument for a value too large, or
    /// for another value while it already leads (resign first).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped while waiting, the candidate holds nothing and takes no place.
    pub async fn campaign(&self, value: impl Into<Vec<u8>>) -> Result<Leadership> {
        let value = value.into();
        crate::key::check_meta(&value).map_err(|e| e.with_resource(self.name()))?;
        if !self.inner.factory.store().capabilities().excludes {
            return Err(Error::unsupported(
                "an election needs a store that excludes: here every candidate would lead",
            )
            .with_resource(self.name())
            .with_store(self.inner.factory.store()));
        }
        let resigned = self.inner.resigned.subscribe();
        let _turn = self.inner.turn.lock().await;
        let given_up = || {
            Error::conflict(self.name())
                .with_reason("the candidate resigned while this campaign waited")
        };
        let (epoch, mut bumped) = {
            let mut st = locked(&self.inner.state);
            if resigned.has_changed().unwrap_or(true) {
                return Err(given_up());
            }
            if let (Some(lock), Some(leadership)) = (&st.lock, &st.leadership) {
                if lock.key().meta().as_deref() == Some(&value[..]) {
                    return Ok(leadership.clone());
                }
                return Err(Error::invalid_argument(
                    "this candidate already leads with another value: resign first",
                )
                .with_resource(self.name()));
            }
            // A re-campaign under way gives way to this one.
            let _ = st.end(&self.inner.leading);
            (self.inner.bump(), self.inner.epoch.subscribe())
        };
        let lock = self.inner.new_lock(value)?;
        tokio::select! {
            acquired = lock.acquire() => acquired?,
            // Dropping the acquire leaves nothing held (the lock's cancel safety).
            _ = bumped.changed() => return Err(given_up()),
        }
        Inner::install(&self.inner, lock, epoch)
    }

    /// Stops leading (or campaigning, or campaigning again): releases the election's lock; a
    /// campaign of this candidate that waits gives up (with a conflict error). What the release
    /// found ([`Release::NotHeld`] when it did not lead, [`Release::Lost`] when the lock had
    /// been lost meanwhile).
    ///
    /// # Errors
    ///
    /// A store failure of the release (the lock then expires or goes with its session).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: the candidate stops leading at once, and a dropped release still releases
    /// (on the holder's executor, to its end).
    pub async fn resign(&self) -> Result<Release> {
        let lock = {
            let mut st = locked(&self.inner.state);
            self.inner.bump();
            self.inner.resigned.send_modify(|r| *r += 1);
            st.end(&self.inner.leading)
        };
        match lock {
            Some(lock) => lock.release().await,
            None => Ok(Release::NotHeld),
        }
    }

    /// Whether this candidate leads now, as a channel that changes when it starts or stops.
    pub fn is_leader(&self) -> watch::Receiver<bool> {
        self.inner.leading.subscribe()
    }

    /// This candidate's current leadership, if it leads.
    pub fn leadership(&self) -> Option<Leadership> {
        locked(&self.inner.state).leadership.clone()
    }

    /// The key of this candidate's lock while it leads (for tests and tools that inspect the
    /// store).
    #[doc(hidden)]
    pub fn leading_key(&self) -> Option<crate::Key> {
        locked(&self.inner.state)
            .lock
            .as_ref()
            .map(|l| l.key().clone())
    }

    /// Who leads now (any candidate, in any process the store can see), or `None`.
    ///
    /// # Errors
    ///
    /// A store failure; `Unsupported` on stores that cannot tell who holds a lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        observe::leader_of(self.inner.factory.store().as_ref(), self.name()).await
    }

    /// Every change of leader from now on, starting with the current one (see [`Observer`]).
    pub fn observe(&self) -> Observer {
        Observer::new(self.inner.factory.store().clone(), self.name().to_owned())
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.inner.name)
            .field("leading", &*self.inner.leading.borrow())
            .field("recampaign", &self.inner.recampaign.load(Ordering::Relaxed))
            .finish()
    }
}
