//! One acquisition attempt on the protocol: subscribe, count, probe, decide, confirm, fence.
//! The decisions themselves are `decide.rs`'s; this is the I/O around them.

use redis::Value;

use super::Inner;
use super::conn::redis_error;
use super::decide::{self, Confirm, Incumbent, Record, Wire};
use super::probe::{self, Probe, jitter, numsub};
use super::sub::Sub;
use crate::error::Result;

/// Draws a writer's fencing token (`KEYS[1]` the counter): `INCR`, and a counter found
/// missing (the draw made it 1: a new channel, or Redis restarted empty) set to the server's
/// clock in microseconds, which is the token. One script, so no other writer can draw a small
/// token between the `INCR` and the seed (two steps let a writer that drew 2 there hold with a
/// token below the ones before the restart).
const DRAW: &str = r"
local n = redis.call('INCR', KEYS[1])
if n == 1 then
  local t = redis.call('TIME')
  n = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('SET', KEYS[1], string.format('%d', n))
end
return n
";

/// Seeds a missing fencing counter (`KEYS[1]`) from the server's clock in microseconds for a
/// reader that found it missing, unless someone set it meanwhile; replies the counter.
const SEED: &str = r"
local v = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if v == 0 then
  local t = redis.call('TIME')
  v = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('SET', KEYS[1], string.format('%d', v))
end
return v
";

fn draw_script() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| redis::Script::new(DRAW))
}

fn seed_script() -> &'static redis::Script {
    static SCRIPT: std::sync::OnceLock<redis::Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| redis::Script::new(SEED))
}

/// How an attempt ended.
pub(super) enum Attempt {
    /// Held: the subscription that is the lock, and the fencing token.
    Held(Sub, u64),
    /// Not this time (someone holds, the probe was inconclusive, the promotion did not
    /// confirm). A waiting writer that was elected keeps its subscription for the next one.
    Again,
}

/// A writer or reader trying to get in, across its attempts.
pub(super) struct Contender<'a> {
    inner: &'a Inner,
    channel: &'a str,
    id: &'a str,
    /// This holder's own read subscription while it promotes: not a rival.
    own_reader: Option<&'a str>,
    /// Fail when locked: one conclusive "held" ends it, and an election is never kept.
    fwl: bool,
    /// The subscription an elected writer keeps between attempts.
    sub: Option<Sub>,
    elected: bool,
    /// A waiter's pause tries again at once when the channel's count falls below this: fewer
    /// are subscribed than the participants that keep this contender out (and its own kept
    /// subscription), so one of them left. Other waiters coming and going never bring it
    /// that low, so they do not wake it (they once had every waiter of a held lock
    /// resubscribing every few milliseconds). 0 after an attempt that saw nothing for certain:
    /// only the pause's end or a release notice wakes it.
    pub(super) wake_below: u64,
}

impl<'a> Contender<'a> {
    /// A contender that has not tried yet.
    pub(super) fn new(
        inner: &'a Inner,
        channel: &'a str,
        id: &'a str,
        own_reader: Option<&'a str>,
        fwl: bool,
    ) -> Self {
        Contender {
            inner,
            channel,
            id,
            own_reader,
            fwl,
            sub: None,
            elected: false,
            wake_below: 0,
        }
    }

    fn rivals(&self, records: Vec<Record>) -> Vec<Record> {
        records
            .into_iter()
            .filter(|r| Some(r.holder_id.as_str()) != self.own_reader)
            .collect()
    }

    /// Gives the election and the subscription up.
    fn drop_out(&mut self) -> Attempt {
        self.elected = false;
        self.sub = None;
        self.wake_below = 0;
        Attempt::Again
    }

    /// Gives the election and the subscription up, kept out by the holders in `records`.
    fn kept_out(&mut self, records: &[Record]) -> Attempt {
        self.drop_out();
        self.wake_below = self.blockers(records);
        Attempt::Again
    }

    /// How many of the others in `records` stay until they release: exclusive holders (and
    /// legacy ones), elected writers, and for an elected writer, the readers it waits for.
    /// Not writers that were not elected: they leave after their attempt.
    fn blockers(&self, records: &[Record]) -> u64 {
        records
            .iter()
            .filter(|r| r.holder_id != self.id)
            .filter(|r| match r.mode {
                Wire::Exclusive => true,
                Wire::Pending => r.legacy || r.elected == Some(true),
                Wire::Shared => r.legacy || self.elected,
            })
            .count() as u64
    }

    /// Keeps the elected writer's subscription and waits for a change among `records`.
    fn wait_elected(&mut self, records: &[Record]) -> Attempt {
        self.wake_below = 1 + self.blockers(records);
        Attempt::Again
    }

    /// Subscribes unless the elected writer's subscription is kept; the channel's count (ours
    /// included), and the fencing counter when a reader subscribed afresh.
    async fn subscribe(&mut self, mode: Wire) -> Result<(u64, Option<u64>)> {
        if self.sub.as_ref().is_some_and(Sub::is_live) {
            return Ok((numsub(&self.inner.conns, self.channel).await?, None));
        }
        self.elected = false;
        self.sub = None;
        let (sub, count, fence) = Sub::open(
            &self.inner.conns,
            self.channel,
            self.id,
            mode,
            self.inner.timing,
            mode == Wire::Shared,
        )
        .await?;
        self.sub = Some(sub);
        Ok((count, fence))
    }

    fn set(&self, mode: Wire, elected: bool) {
        if let Some(sub) = &self.sub {
            sub.shared.set(mode, elected);
        }
    }

    /// A probe of our channel, expecting `n` participants, reaping allowed. Subscribers that
    /// are not lock holders and never answer are an error: waiting cannot help.
    async fn probe(&self, n: u64) -> Result<Probe> {
        match probe::probe(&self.inner.conns, self.inner.timing, self.channel, n, true).await? {
            Probe::Foreign(silent) => Err(probe::foreign(silent)),
            other => Ok(other),
        }
    }

    /// One writer's attempt.
    ///
    /// # Cancel safety
    ///
    /// Dropped mid-flight, the subscription it made goes with the contender; nothing else of it
    /// stays on the server.
    pub(super) async fn write(&mut self) -> Result<Attempt> {
        let (n, _) = self.subscribe(Wire::Pending).await?;
        if n == 0 {
            // Our own subscription is gone (reaped in a race): a failed attempt.
            return Ok(self.drop_out());
        }
        if n == 1 && self.own_reader.is_none() {
            self.set(Wire::Exclusive, self.elected);
            return self.confirm_and_fence().await;
        }
        let records = match self.probe(n).await? {
            Probe::Inconclusive if self.elected && !self.fwl => {
                self.wake_below = 0;
                return Ok(Attempt::Again);
            }
            Probe::Inconclusive | Probe::Foreign(_) => return Ok(self.drop_out()),
            Probe::Conclusive(records) => self.rivals(records),
        };
        let others_read = records
            .iter()
            .any(|r| r.holder_id != self.id && r.mode == Wire::Shared);
        if self.elected {
            match decide::incumbent(self.id, &records) {
                Incumbent::Forfeit => Ok(self.kept_out(&records)),
                Incumbent::Wait if self.fwl => Ok(self.drop_out()),
                Incumbent::Wait => Ok(self.wait_elected(&records)),
                Incumbent::Promote => {
                    self.set(Wire::Exclusive, true);
                    self.confirm_and_fence().await
                }
            }
        } else if !decide::elected(self.id, &records) || (others_read && self.fwl) {
            Ok(self.kept_out(&records))
        } else if others_read {
            // Elected behind readers: advertise it and keep the subscription, which blocks new
            // readers until ours drain.
            self.elected = true;
            self.set(Wire::Pending, true);
            Ok(self.wait_elected(&records))
        } else {
            self.elected = true;
            self.set(Wire::Exclusive, true);
            self.confirm_and_fence().await
        }
    }

    /// The confirm rounds after a promotion (the fast path's too), then the fencing token and
    /// the local check.
    async fn confirm_and_fence(&mut self) -> Result<Attempt> {
        let budget = self.inner.timing.unavailable;
        let start = tokio::time::Instant::now();
        let mut first = true;
        // Whether the election may be kept after a demotion: readers were the only reason (and
        // the writer is, or would now be, elected), or the rounds were inconclusive for an
        // elected writer (which never gives way over noise).
        let mut keep = self.elected;
        let mut drawn = None;
        let mut confirmed_at_once = false;
        let confirmed = loop {
            if !first {
                if start.elapsed() >= budget {
                    break false;
                }
                tokio::time::sleep(jitter(self.inner.timing.poll())).await;
            }
            let pipelined = first && self.own_reader.is_none();
            let m = if pipelined {
                // The first round draws the token with the count, in one round trip: a token
                // drawn by a confirm that then fails is only a gap in the sequence.
                let (m, token) = self.count_and_draw().await?;
                drawn = Some(token);
                m
            } else {
                numsub(&self.inner.conns, self.channel).await?
            };
            first = false;
            if m == 0 {
                keep = false;
                break false;
            }
            if m == 1 && self.own_reader.is_none() {
                confirmed_at_once = pipelined;
                break true;
            }
            match self.probe(m).await? {
                Probe::Inconclusive | Probe::Foreign(_) => {}
                Probe::Conclusive(records) => {
                    let records = self.rivals(records);
                    match decide::confirm(self.id, &records) {
                        Confirm::Confirmed => break true,
                        Confirm::Demote => {
                            let writers: Vec<Record> = records
                                .iter()
                                .filter(|r| r.mode != Wire::Shared)
                                .cloned()
                                .collect();
                            keep = decide::confirm(self.id, &writers) != Confirm::Demote
                                && (self.elected || decide::elected(self.id, &records));
                            break false;
                        }
                        Confirm::Retry => {}
                    }
                }
            }
        };
        if !confirmed {
            if keep && !self.fwl {
                self.elected = true;
                // Back to an elected writer waiting for readers to drain: the readers that got
                // in see it and new ones stay out. Python drops the election here and starts
                // over, which lets churning readers starve it.
                self.set(Wire::Pending, true);
                return Ok(Attempt::Again);
            }
            self.set(Wire::Pending, false);
            return Ok(self.drop_out());
        }
        // A token drawn in the first round is older than the probes after it: draw again then,
        // so it is later than every writer those probes saw leave.
        let token = match drawn {
            Some(token) if confirmed_at_once => token,
            _ => self.fence(true).await?,
        };
        match self.sub.take() {
            Some(sub) if sub.is_live() => Ok(Attempt::Held(sub, token)),
            _ => Ok(self.drop_out()),
        }
    }

    /// `PUBSUB NUMSUB C` and a draw of `C-fence` in one round trip (the script by `EVAL`: a
    /// pipeline cannot load it on `NOSCRIPT`).
    async fn count_and_draw(&self) -> Result<(u64, u64)> {
        let mut conn = self.inner.conns.command().await?;
        let (counted, token): (Vec<Value>, u64) = redis::pipe()
            .cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(self.channel)
            .cmd("EVAL")
            .arg(DRAW)
            .arg(1)
            .arg(format!("{}-fence", self.channel))
            .query_async(&mut conn)
            .await
            .map_err(|e| {
                redis_error("cannot count the lock channel and draw a fencing token", &e)
            })?;
        let m = match counted.get(1) {
            Some(Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
            _ => 0,
        };
        Ok((m, token))
    }

    /// A draw of `C-fence` for a writer (a new token), `GET` for a reader (at least the last
    /// writer's, below the next one's).
    async fn fence(&self, write: bool) -> Result<u64> {
        let key = format!("{}-fence", self.channel);
        let mut conn = self.inner.conns.command().await?;
        if write {
            return draw_script()
                .key(&key)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| redis_error("cannot draw a fencing token", &e));
        }
        let value: Value = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_error("cannot read the fencing counter", &e))?;
        let token = match value {
            Value::Int(n) => u64::try_from(n).unwrap_or(0),
            Value::BulkString(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            _ => 0,
        };
        self.seeded(token).await
    }

    /// A reader's `token`, unless the counter was missing (a new channel, or Redis restarted
    /// empty): then the counter seeded from the server's clock, as a writer's draw seeds it.
    async fn seeded(&self, token: u64) -> Result<u64> {
        if token != 0 {
            return Ok(token);
        }
        let mut conn = self.inner.conns.command().await?;
        seed_script()
            .key(format!("{}-fence", self.channel))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| redis_error("cannot seed the fencing counter", &e))
    }

    /// One reader's attempt.
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Contender::write).
    pub(super) async fn read(&mut self) -> Result<Attempt> {
        let (n, fence) = self.subscribe(Wire::Shared).await?;
        if n == 0 {
            return Ok(self.drop_out());
        }
        let token = if n > 1 {
            match self.probe(n).await? {
                Probe::Conclusive(records) if decide::reader_may_hold(self.id, &records) => {}
                Probe::Conclusive(records) => return Ok(self.kept_out(&records)),
                _ => return Ok(self.drop_out()),
            }
            // Read after the probe: at least the token of any writer that held before it.
            self.fence(false).await?
        } else {
            match fence {
                Some(token) => self.seeded(token).await?,
                None => self.fence(false).await?,
            }
        };
        match self.sub.take() {
            Some(sub) if sub.is_live() => Ok(Attempt::Held(sub, token)),
            _ => Ok(self.drop_out()),
        }
    }
}
