//! Taking a lock on the pub/sub store: the write and read flows (promotion and demotion
//! included), the waiters' gates, and a waiter's pause between attempts.

use std::sync::{Arc, Weak};

use super::attempt::{Attempt, Contender};
use super::decide::Wire;
use super::probe::{self, jitter};
use super::sub::{self, Life};
use super::{COUNT_POLL, Handle, Held, RedisPubSubStore, conn, lock};
use crate::error::{Error, Result};
use crate::key::{Key, Mode};
use crate::store::{Acquired, Conflict, Saved};

impl RedisPubSubStore {
    /// A pass through the gate of `channel`'s waiters in `mode` (one gate for writers, one for
    /// readers: a reader held up by waiting writers does not hold up this store's writers too).
    async fn through_gate(&self, channel: &str, mode: Mode) -> tokio::sync::OwnedMutexGuard<()> {
        let name = format!("{channel} {mode:?}");
        let gate = {
            let mut gates = lock(&self.inner.gates);
            match gates.get(&name).and_then(Weak::upgrade) {
                Some(gate) => gate,
                None => {
                    gates.retain(|_, g| g.strong_count() > 0);
                    let gate = Arc::new(tokio::sync::Mutex::new(()));
                    gates.insert(name, Arc::downgrade(&gate));
                    gate
                }
            }
        };
        gate.lock_owned().await
    }

    fn fail(&self, key: &Key, err: Error) -> Error {
        err.with_resource(key.resource()).with_store(self)
    }

    /// Takes the write lock (`fwl`: one attempt) or promotes the holder's read lock.
    pub(super) async fn write(&self, key: &Key, fwl: bool) -> Result<Saved> {
        let channel = self.channel(key.resource())?;
        let handle = key.handle::<Handle>(self.inner.owner);
        let (first, second) = Self::ids(key);
        let mut reader = None;
        match handle.current() {
            Some((shared, Mode::Write, token)) if shared.life() == Life::Live => {
                return Ok(Acquired::fenced(token).into());
            }
            Some((shared, Mode::Read, _)) if shared.life() == Life::Live => reader = Some(shared),
            Some(_) => {
                lock(&handle.held).take();
            }
            None => {}
        }
        let id = match &reader {
            Some(r) if r.id == first => second,
            _ => first,
        };
        let mut contender = Contender::new(
            &self.inner,
            &channel,
            &id,
            reader.as_ref().map(|r| r.id.as_str()),
            fwl,
        );
        // A promotion goes past the gate: a local writer waiting for this reader to go must not
        // keep it from promoting.
        let _gate = if fwl || reader.is_some() {
            None
        } else {
            Some(self.through_gate(&channel, Mode::Write).await)
        };
        let mut notices = None;
        loop {
            if let Some(n) = notices.as_mut() {
                conn::Notices::mark(n);
            }
            let outcome = contender.write().await.map_err(|e| self.fail(key, e))?;
            if let Attempt::Held(sub, token) = outcome {
                let old = lock(&handle.held).replace(Held {
                    sub,
                    mode: Mode::Write,
                    token,
                });
                key.mark_unserializable();
                if let Some(old) = old {
                    // The read lock goes only now that the write lock is confirmed.
                    old.sub.close().await;
                }
                return Ok(Acquired::fenced(token).into());
            }
            let kept = match &reader {
                Some(r) if r.life() == Life::Live => Some(Mode::Read),
                Some(_) => {
                    lock(&handle.held).take();
                    return Ok(Conflict::new().with_kept(None).into());
                }
                None => None,
            };
            if fwl {
                return Ok(Conflict::new().with_kept(kept).into());
            }
            self.pause(&channel, &mut notices, contender.wake_below)
                .await;
        }
    }

    /// Takes a read lock (`fwl`: one attempt), or demotes the holder's write lock.
    pub(super) async fn read(&self, key: &Key, fwl: bool) -> Result<Saved> {
        let channel = self.channel(key.resource())?;
        let handle = key.handle::<Handle>(self.inner.owner);
        let (id, _) = Self::ids(key);
        match handle.current() {
            Some((shared, mode, token)) if shared.life() == Life::Live => {
                if mode == Mode::Write {
                    // Exclusive to shared only lets readers in: one local change.
                    shared.set(Wire::Shared, false);
                    if let Some(held) = lock(&handle.held).as_mut() {
                        held.mode = Mode::Read;
                    }
                }
                return Ok(Acquired::fenced(token).into());
            }
            Some(_) => {
                lock(&handle.held).take();
            }
            None => {}
        }
        let mut contender = Contender::new(&self.inner, &channel, &id, None, fwl);
        let _gate = if fwl {
            None
        } else {
            Some(self.through_gate(&channel, Mode::Read).await)
        };
        let mut notices = None;
        loop {
            if let Some(n) = notices.as_mut() {
                conn::Notices::mark(n);
            }
            match contender.read().await.map_err(|e| self.fail(key, e))? {
                Attempt::Held(sub, token) => {
                    *lock(&handle.held) = Some(Held {
                        sub,
                        mode: Mode::Read,
                        token,
                    });
                    key.mark_unserializable();
                    return Ok(Acquired::fenced(token).into());
                }
                Attempt::Again if fwl => return Ok(Conflict::new().into()),
                Attempt::Again => {
                    self.pause(&channel, &mut notices, contender.wake_below)
                        .await
                }
            }
        }
    }

    /// A waiter's pause: until a release notice of this library's holders, until the
    /// channel's count falls below `wake_below` (one of those that kept the last attempt out
    /// left, whatever library it is from: released, crashed, killed; asked every
    /// [`COUNT_POLL`] with one `PUBSUB NUMSUB`, which subscribes nothing and so disturbs
    /// nobody's probe), or at most `check_interval × U[0.5, 1.5)` (portalocker's pace, for
    /// what no count shows). Other waiters coming and going do not end it. The notices are
    /// listened to from the first pause on, and the attempt after it sees a release in
    /// between.
    async fn pause(&self, channel: &str, notices: &mut Option<conn::Notices>, wake_below: u64) {
        if notices.as_ref().is_none_or(conn::Notices::is_dead) {
            *notices = None;
            if let Ok(listener) = self.inner.conns.listener().await
                && let Ok(n) = listener.notices(sub::notice_channel(channel)).await
            {
                // Listening now: try again at once, so a release before it is not missed.
                *notices = Some(n);
                return;
            }
        }
        let until = tokio::time::Instant::now() + jitter(self.inner.config.check_interval);
        let watch_count = async {
            if wake_below == 0 {
                return std::future::pending::<()>().await;
            }
            loop {
                match probe::numsub(&self.inner.conns, channel).await {
                    Ok(now) if now < wake_below => return,
                    Ok(_) => {}
                    Err(_) => return std::future::pending::<()>().await,
                }
                tokio::time::sleep(COUNT_POLL).await;
            }
        };
        let notice = async {
            match notices.as_mut() {
                Some(n) => n.changed().await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = notice => {}
            () = watch_count => {}
            () = tokio::time::sleep_until(until) => {}
        }
    }
}
