//! [`Election`]: one leader among candidates, fenced and observable, built on a lock: the
//! leader is the holder of the lock named after the election, its value is the holder's
//! metadata, its term the acquisition's fencing token.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::lock::Lock;
use crate::lock::factory::LockFactory;
use crate::lock::lockable::{Lockable as _, Release};
use crate::lock::lost::{KeepAlive, LockLost};
use crate::mutex::lock as locked;
use crate::store::HolderInfo;

mod observe;

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

struct Inner {
    factory: LockFactory,
    name: String,
    recampaign: AtomicBool,
    leading: watch::Sender<bool>,
    /// Bumped (under the state's mutex) by every campaign and resignation: a campaign or
    /// re-campaign started before one installs nothing, and a waiting one gives up.
    epoch: watch::Sender<u64>,
    /// One campaign of this candidate at a time (a resignation does not wait for it).
    turn: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    lock: Option<Lock>,
    keep: Option<KeepAlive>,
    leadership: Option<Leadership>,
    /// The task that watches the leadership for loss (and campaigns again after one).
    monitor: Option<tokio::task::AbortHandle>,
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

    /// Completes when this leadership is lost, with why; pending forever after a resignation.
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
            inner: Arc::new(Inner {
                factory: self.clone(),
                name: name.into(),
                recampaign: AtomicBool::new(false),
                leading: watch::channel(false).0,
                epoch: watch::channel(0).0,
                turn: tokio::sync::Mutex::new(()),
                state: Mutex::new(State::default()),
            }),
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
        crate::meta::check_meta(&value).map_err(|e| e.with_resource(self.name()))?;
        let _turn = self.inner.turn.lock().await;
        let (epoch, mut bumped) = {
            let mut st = locked(&self.inner.state);
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
            if let Some(task) = st.monitor.take() {
                task.abort();
            }
            (self.inner.bump(), self.inner.epoch.subscribe())
        };
        let lock = self
            .inner
            .factory
            .create_lock(self.name())
            .with_meta(value)?;
        tokio::select! {
            acquired = lock.acquire() => acquired?,
            // Dropping the acquire leaves nothing held (the lock's cancel safety).
            _ = bumped.changed() => {
                return Err(Error::conflict(self.name())
                    .with_reason("the candidate resigned while this campaign waited"));
            }
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
    pub async fn resign(&self) -> Result<Release> {
        let lock = {
            let mut st = locked(&self.inner.state);
            self.inner.bump();
            if let Some(task) = st.monitor.take() {
                task.abort();
            }
            st.keep = None;
            st.leadership = None;
            st.lock.take()
        };
        self.inner.leading.send_replace(false);
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
    pub async fn leader(&self) -> Result<Option<Leader>> {
        observe::leader_of(self.inner.factory.store().as_ref(), self.name()).await
    }

    /// Every change of leader from now on, starting with the current one (see [`Observer`]).
    pub fn observe(&self) -> Observer {
        Observer::new(self.inner.factory.store().clone(), self.name().to_owned())
    }
}

impl Inner {
    /// A new epoch (call with the state's mutex held): what was under way gives up.
    fn bump(&self) -> u64 {
        self.epoch.send_modify(|e| *e += 1);
        *self.epoch.borrow()
    }

    /// Makes `lock`, just acquired by the campaign of `epoch`, this candidate's leadership,
    /// unless a resignation or another campaign came since (then it lets it go).
    fn install(this: &Arc<Inner>, lock: Lock, epoch: u64) -> Result<Leadership> {
        let keep = match lock.keep_alive() {
            Ok(keep) => keep,
            Err(err) => {
                lock.release_in_background();
                return Err(err);
            }
        };
        let (lost_tx, lost_rx) = watch::channel(None);
        let leadership = Leadership {
            term: lock.fencing_token(),
            since: SystemTime::now(),
            lost: lost_rx,
        };
        let mut st = locked(&this.state);
        if *this.epoch.borrow() != epoch {
            lock.release_in_background();
            return Err(Error::conflict(this.name.clone())
                .with_reason("a resignation or another campaign of this candidate came first"));
        }
        let watch_loss = keep.lost();
        let weak = Arc::downgrade(this);
        let monitor = tokio::spawn(async move {
            let lost = watch_loss.await;
            lost_tx.send_replace(Some(lost.clone()));
            Inner::after_loss(weak, epoch, lost).await;
        });
        st.lock = Some(lock);
        st.keep = Some(keep);
        st.leadership = Some(leadership.clone());
        st.monitor = Some(monitor.abort_handle());
        drop(st);
        this.leading.send_replace(true);
        Ok(leadership)
    }

    /// After the leadership of `epoch` was lost: stop leading, and campaign again if asked.
    async fn after_loss(weak: Weak<Inner>, epoch: u64, lost: LockLost) {
        let Some(this) = weak.upgrade() else { return };
        let (value, factory, name) = {
            let mut st = locked(&this.state);
            if *this.epoch.borrow() != epoch {
                return;
            }
            st.keep = None;
            st.leadership = None;
            let value = st.lock.take().and_then(|l| {
                l.release_in_background();
                l.key().meta()
            });
            (value, this.factory.clone(), this.name.clone())
        };
        this.leading.send_replace(false);
        tracing::warn!(target: crate::logging::TARGET, election = %name, reason = %lost.reason,
            "leadership lost");
        if !this.recampaign.load(Ordering::Relaxed) {
            return;
        }
        drop(this);
        let value = value.map(|v| v.to_vec()).unwrap_or_default();
        let mut backoff = Duration::from_millis(100);
        loop {
            let lock = match factory.create_lock(&name).with_meta(value.clone()) {
                Ok(lock) => lock,
                Err(_) => return,
            };
            match lock.acquire().await {
                Ok(()) => {
                    let Some(this) = weak.upgrade() else {
                        lock.release_in_background();
                        return;
                    };
                    // The monitor of the new leadership takes over; this task ends.
                    let _ = Inner::install(&this, lock, epoch);
                    return;
                }
                Err(err) => {
                    tracing::warn!(target: crate::logging::TARGET, election = %name,
                        error = %err, "campaigning again failed; retrying");
                    if weak.strong_count() == 0 {
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let st = match self.state.get_mut() {
            Ok(st) => st,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(task) = st.monitor.take() {
            task.abort();
        }
        if let Some(lock) = st.lock.take() {
            lock.release_in_background();
        }
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
