//! One holder: a task that owns the holder's lease and queue keys and runs its requests in
//! order. Callers send commands and await the answer; a caller that goes away only drops its
//! end of the answer, and the task finishes what it started: a wait whose caller left deletes
//! its queue key, a grant nobody will receive is given back.
//!
//! While a wait is pending, the task still answers the holder's checks, refreshes, releases
//! and tries (a try that would need the waiting key's place is refused at once); a sibling's
//! wait is taken up when the pending one ends.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use etcd_client::{SortOrder, SortTarget, TxnOpResponse};
use tokio::sync::{mpsc, oneshot, watch};

use super::clock::BootInstant;
use super::conn::Core;
use super::lease::{Lease, State, lease_gone};
use super::queue::{self, Entry, Kind};
use super::record;
use crate::meta::HolderRecord;
use crate::permits::Permits;
use crate::store::tasks::Task;

mod enqueue;
mod keys;
mod ops;
mod records;
mod release;
use crate::error::{Error, LostReason, Result};
use crate::key::Mode;
use crate::mutex::lock;
use crate::store::{Acquired, Holding, Saved};
use keys::Stale;

pub(super) enum Cmd {
    Save {
        mode: Mode,
        wait: bool,
        ttl: Option<Duration>,
        /// The holder's metadata, recorded with this acquisition.
        meta: Option<Meta>,
        reply: oneshot::Sender<Result<Saved>>,
    },
    Check {
        refresh: bool,
        reply: oneshot::Sender<Result<Holding>>,
    },
    Release {
        reply: oneshot::Sender<Result<bool>>,
    },
    /// A release that leaves the key to run out `after` from now.
    ReleaseAfter {
        after: Duration,
        reply: oneshot::Sender<Result<Holding>>,
    },
}

/// A holder's metadata, as its key carries it.
pub(super) type Meta = Arc<[u8]>;

/// What the holder holds, for loss watchers and introspection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Life {
    pub(super) held: Option<Mode>,
    /// Why the last hold ended without a release.
    pub(super) lost: Option<LostReason>,
    /// Counts the holds that ended (released or lost).
    pub(super) ended: u64,
    /// The holder's lease, while it has one.
    pub(super) lease: Option<i64>,
}

impl crate::store::tasks::Life for Life {
    fn held(&self) -> Option<Mode> {
        self.held
    }
    fn ended(&self) -> u64 {
        self.ended
    }
    fn lost(&self) -> Option<LostReason> {
        self.lost
    }
}

/// Where the current lease's keeper writes until when the lease certainly lasts. A cell per
/// lease, so a keeper stopped a moment late cannot write over its successor's.
pub(super) type Confirmed = Arc<std::sync::Mutex<Option<super::lease::Confirmed>>>;

/// How long the current lease certainly lasts without another keep-alive: from the last
/// keep-alive etcd answered (its send time plus the ttl it answered), on the boot clock, so a
/// lease that ended while the machine slept has nothing left. An unanswered keep-alive never
/// extends it.
pub(super) fn lease_remaining(confirmed: &Confirmed) -> Option<Duration> {
    let slot = lock(confirmed);
    let until = *lock(slot.as_ref()?);
    Some(super::clock::left(until, BootInstant::now()))
}

/// Starts the task of one holder of `resource`: a lock's, or a semaphore's holder of
/// `permits` (its keys in the semaphore's directory).
pub(super) fn start(
    core: Arc<Core>,
    resource: String,
    confirmed: Confirmed,
    permits: Option<Permits>,
) -> Task<Cmd, Life> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (life_tx, life) = watch::channel(Life::default());
    let (lost_tx, lost_rx) = mpsc::unbounded_channel();
    let dir = match permits {
        Some(_) => super::semaphore::dir(&core.config.prefix, &resource),
        None => queue::dir(&core.config.prefix, &resource),
    };
    let actor = Actor {
        confirmed,
        permits,
        core,
        resource,
        dir,
        lease: None,
        held: None,
        lost: None,
        ended: 0,
        life: life_tx,
        rx,
        deferred: std::collections::VecDeque::new(),
        lost_tx,
        lost_rx,
        abandoned: Vec::new(),
        stale: Vec::new(),
        meta: None,
    };
    tokio::spawn(actor.run());
    Task { tx, life }
}

/// A key this holder has in the queue, and the watch that reports its delete.
struct Mine {
    entry: Entry,
    /// The revision at which this key was seen to hold: its fencing token, as `etcdctl lock`
    /// exports it (`ETCD_LOCK_REV`). Every later holder's is greater: it sees this key gone,
    /// which is a later revision.
    token: u64,
    /// What its record says: the metadata and when it acquired (a re-save keeps that).
    record: HolderRecord,
    watch: Option<tokio::task::AbortHandle>,
}

impl Drop for Mine {
    fn drop(&mut self) {
        if let Some(w) = self.watch.take() {
            w.abort();
        }
    }
}

struct Actor {
    confirmed: Confirmed,
    /// A semaphore's holder: the permits it takes (`None` for a lock's holder).
    permits: Option<Permits>,
    core: Arc<Core>,
    resource: String,
    dir: Vec<u8>,
    lease: Option<Lease>,
    /// The key that holds, with its mode (a reader key reads, a writer key writes).
    held: Option<Mine>,
    lost: Option<LostReason>,
    ended: u64,
    life: watch::Sender<Life>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    /// Waits that came in while another was pending, taken up in order after it.
    deferred: std::collections::VecDeque<Cmd>,
    lost_tx: mpsc::UnboundedSender<(Vec<u8>, i64)>,
    lost_rx: mpsc::UnboundedReceiver<(Vec<u8>, i64)>,
    /// Leases this holder gave up and that are being revoked: their keys are its own.
    abandoned: Vec<i64>,
    /// Keys of this holder's whose delete has not landed yet, on a lease that still holds
    /// something (tried again until they go).
    stale: Vec<Stale>,
    /// The metadata of the save under way, recorded by every transaction that puts or reads
    /// its key.
    meta: Option<Meta>,
}

/// The answer of the transaction that puts a key and reads the queue.
struct Read {
    queue: Vec<Entry>,
    /// The revision the read saw: a watch from the next one misses nothing. It is also the
    /// revision of the record put with the read.
    revision: i64,
    /// The record of a grant, as this read put it (if `recorded`) or as it is to be written.
    record: HolderRecord,
    /// Whether the read put `record` (it certainly granted: `record::put_if_granted`).
    recorded: bool,
}

fn mode_of(kind: Kind) -> Mode {
    match kind {
        Kind::Reader => Mode::Read,
        Kind::Writer => Mode::Write,
    }
}

fn kind_of(mode: Mode) -> Kind {
    match mode {
        Mode::Read => Kind::Reader,
        Mode::Write => Kind::Writer,
    }
}

fn token(rev: i64) -> u64 {
    u64::try_from(rev).unwrap_or(0)
}

impl Actor {
    async fn run(mut self) {
        let mut retry = keys::RETRY_FIRST;
        loop {
            if let Some(cmd) = self.deferred.pop_front() {
                self.command(cmd).await;
                self.revoke_idle_lease();
                continue;
            }
            let lease_state = self.lease.as_ref().map(|l| l.state.clone());
            let stale = !self.stale.is_empty();
            tokio::select! {
                cmd = self.rx.recv() => match cmd {
                    Some(cmd) => self.command(cmd).await,
                    None => break,
                },
                Some((key, rev)) = self.lost_rx.recv() => self.key_deleted(&key, rev),
                () = lease_gone(lease_state, false) => self.lease_ended(),
                () = tokio::time::sleep(retry), if stale => {
                    self.sweep().await;
                    retry = (retry * 2).min(keys::RETRY_MAX);
                }
            }
            if self.stale.is_empty() {
                retry = keys::RETRY_FIRST;
            }
            self.revoke_idle_lease();
        }
        // The holder's key went: its lease goes, and every key on it with it.
        self.abandon_lease();
    }

    async fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Save {
                mode,
                wait,
                ttl,
                meta,
                reply,
            } => {
                if !reply.is_closed() {
                    self.meta = meta;
                    self.save(mode, wait, ttl, reply).await;
                }
            }
            Cmd::Release { reply } => {
                let answer = self.release().await;
                // The lease's revoke is under way before the answer: a `close` right after
                // it waits for the revoke.
                self.revoke_idle_lease();
                let _ = reply.send(answer);
            }
            Cmd::ReleaseAfter { after, reply } => {
                let answer = self.release_after(after).await;
                self.revoke_idle_lease();
                let _ = reply.send(answer);
            }
            other => self.check_or_release(other).await,
        }
    }

    /// Answers a check or a release (also while a wait is pending); a save is not one.
    pub(super) async fn check_or_release(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Check { refresh, reply } => {
                let answer = self.check(refresh).await;
                let _ = reply.send(answer);
            }
            Cmd::Release { reply } => {
                let answer = self.release().await;
                let _ = reply.send(answer);
            }
            Cmd::ReleaseAfter { after, reply } => {
                let answer = self.release_after(after).await;
                let _ = reply.send(answer);
            }
            Cmd::Save { .. } => {}
        }
    }

    pub(super) fn holds(&self) -> Option<Mode> {
        self.held.as_ref().map(|m| mode_of(m.entry.kind))
    }

    pub(super) fn publish(&self) {
        let life = Life {
            held: self.holds(),
            lost: self.lost,
            ended: self.ended,
            lease: self.lease.as_ref().map(|l| l.id),
        };
        self.life.send_if_modified(|l| {
            let changed = *l != life;
            *l = life;
            changed
        });
    }

    fn error(&self, err: Error) -> Error {
        err.with_resource(&self.resource)
            .with_store(&*self.core.shown)
    }

    /// The hold ended without a release.
    /// The holder's key was found gone: lost, as removed by someone while its lease lives,
    /// else as expired with it; the reason.
    fn found_gone(&mut self) -> LostReason {
        let why = if self.lease.as_ref().is_some_and(|l| l.alive()) {
            LostReason::Removed
        } else {
            LostReason::Expired
        };
        self.lose(why);
        why
    }

    fn lose(&mut self, why: LostReason) {
        if self.held.take().is_some() {
            tracing::warn!(target: crate::logging::TARGET, resource = %self.resource,
                store = %self.core.shown, reason = why.as_str(), "the etcd lock was lost");
            self.lost = Some(why);
            self.ended += 1;
        }
        self.publish();
    }

    fn key_deleted(&mut self, key: &[u8], rev: i64) {
        if self
            .held
            .as_ref()
            .is_some_and(|m| m.entry.key == key && m.entry.rev == rev)
        {
            self.lose(LostReason::Removed);
        }
    }

    /// The lease is not confirmed any more (or gone): what it held is lost, and it is given up.
    fn lease_ended(&mut self) {
        let why = match self.lease.as_ref().map(|l| *l.state.borrow()) {
            Some(State::Gone(why)) => why,
            Some(State::Unconfirmed) => LostReason::Expired,
            _ => return,
        };
        self.abandon_lease();
        self.lose(why);
    }

    /// Takes in what the watches and the keeper reported since the last command.
    fn catch_up(&mut self) {
        while let Ok((key, rev)) = self.lost_rx.try_recv() {
            self.key_deleted(&key, rev);
        }
        // A lease not confirmed any more ends a hold; a wait rides it out (`revoke_idle_lease`
        // gives up a lease that holds nothing between commands).
        if self
            .lease
            .as_ref()
            .is_some_and(|l| l.gone() || (!l.alive() && self.held.is_some()))
        {
            self.lease_ended();
        }
    }

    /// Between commands: a lease that holds nothing is revoked (with every key left on it).
    fn revoke_idle_lease(&mut self) {
        if self.held.is_none() && self.lease.is_some() {
            self.abandon_lease();
            self.publish();
        }
    }

    /// Stops keeping the lease alive and revokes it (tried again until it lands); its keys
    /// stay this holder's own until then.
    fn abandon_lease(&mut self) {
        if let Some(lease) = self.give_up_lease() {
            lease.revoke(&self.core);
        }
    }

    /// The lease taken out of the holder, its keys this holder's own until it is revoked.
    fn give_up_lease(&mut self) -> Option<Lease> {
        let lease = self.lease.take()?;
        *lock(&self.confirmed) = None;
        self.stale.retain(|k| k.lease != lease.id);
        if !lease.gone() {
            self.abandoned.push(lease.id);
        }
        Some(lease)
    }

    /// The leases whose keys are this holder's: the current one, and those being revoked.
    fn own_leases(&mut self) -> Vec<i64> {
        let core = self.core.clone();
        self.abandoned.retain(|id| core.is_revoking(*id));
        self.lease
            .iter()
            .map(|l| l.id)
            .chain(self.abandoned.iter().copied())
            .collect()
    }

    /// The lease to put keys on: the current one while it lives (its ttl is fixed while the
    /// holder holds), else a new one of `ttl`.
    async fn lease(&mut self, ttl: Duration) -> Result<i64> {
        let ttl = Duration::from_secs(ttl.as_secs_f64().ceil().max(1.0) as u64);
        if let Some(lease) = &self.lease
            && lease.alive()
            && (lease.asked == ttl || self.held.is_some())
        {
            return Ok(lease.id);
        }
        self.abandon_lease();
        let lease = Lease::grant(&self.core, ttl)
            .await
            .map_err(|e| self.error(e))?;
        let id = lease.id;
        *lock(&self.confirmed) = Some(lease.confirmed.clone());
        self.lease = Some(lease);
        self.publish();
        Ok(id)
    }

    async fn save(
        &mut self,
        mode: Mode,
        wait: bool,
        ttl: Option<Duration>,
        mut reply: oneshot::Sender<Result<Saved>>,
    ) {
        self.catch_up();
        let ttl = ttl.unwrap_or(self.core.config.ttl);
        let mut answer = match (mode, self.holds()) {
            (Mode::Write, Some(Mode::Write)) | (Mode::Read, Some(Mode::Read)) => {
                self.confirm(self.meta.clone()).await
            }
            (Mode::Read, Some(Mode::Write)) => self.demote().await,
            _ => None,
        };
        if answer.is_none() {
            answer = self.enqueue(mode, wait, ttl, &mut reply).await;
        }
        // What the holder holds is published before the answer: a loss watcher made right
        // after the grant must see this hold, not the end of the last one. A lease left
        // holding nothing (a try refused) is revoked first, with the attempt's key: a refused
        // try leaves no key behind when it answers.
        if self.held.is_none()
            && let Some(lease) = self.give_up_lease()
        {
            lease.revoke_now(&self.core).await;
        }
        self.publish();
        if let Some(answer) = answer {
            let _ = reply.send(answer);
        }
    }

    /// A re-save in the mode held, carrying `meta`: still held, with the same token? `None`
    /// when the hold is gone, to be taken afresh. New metadata replaces the record's (and a
    /// writer's value) in place, keeping when it acquired.
    pub(super) async fn confirm(&mut self, meta: Option<Meta>) -> Option<Result<Saved>> {
        let recorded = self.held.as_ref().map(|m| m.record.meta.as_deref());
        if recorded.is_some_and(|r| r != meta.as_deref()) {
            return self.remeta(meta).await;
        }
        match self.check(false).await {
            Ok(Holding::Held(_)) => {
                let token = self.held.as_ref().map_or(0, |m| m.token);
                Some(Ok(Acquired::fenced(token).into()))
            }
            Ok(Holding::NotHeld(_)) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Writer to reader in place: the key keeps its revision, so its place in the queue, and
    /// becomes a reader (writers queued behind it still wait; readers behind them too).
    async fn demote(&mut self) -> Option<Result<Saved>> {
        let Some(lease) = self.lease.as_ref().map(|l| l.id) else {
            return Some(Err(
                self.error(Error::lost(&self.resource, LostReason::Expired))
            ));
        };
        let (entry, acquired_at) = self
            .held
            .as_ref()
            .map(|m| (m.entry.clone(), m.record.acquired_at))?;
        // The demotion's revision is its token: the record put with it carries none.
        let record = HolderRecord::new(self.meta_vec(), acquired_at);
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.rev,
            )])
            .and_then([
                TxnOp::put(
                    entry.key.clone(),
                    queue::READER,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                record::put(&self.core.config.prefix, &entry.key, &record, lease),
            ]);
        match self.core.txn(txn).await {
            Ok(r) if r.succeeded() => {
                let at = token(r.header().map_or(entry.rev, |h| h.revision()));
                if let Some(m) = self.held.as_mut() {
                    m.entry.kind = Kind::Reader;
                    m.token = at;
                    m.record = record;
                }
                Some(Ok(Acquired::fenced(at).into()))
            }
            Ok(_) => {
                // The write key is gone: read afresh.
                self.lose(LostReason::Removed);
                None
            }
            Err(e) => Some(Err(self.error(e))),
        }
    }
}

/// Every key under the directory with its value, in create-revision order.
fn list_options() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

/// The queue from the answers of a transaction (its range reads, nested ones included).
fn listed(dir: &[u8], answers: &[TxnOpResponse]) -> Vec<Entry> {
    let kvs = super::semaphore::read_kvs(answers);
    queue::entries(
        dir,
        kvs.iter()
            .map(|kv| (kv.key(), kv.value(), kv.create_revision(), kv.lease())),
    )
}
