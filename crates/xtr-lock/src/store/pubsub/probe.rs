//! Who is on a lock channel: `PUBSUB NUMSUB` for how many, a ping answered on a private
//! response channel for who, and reaping of counted participants that stay silent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;
use redis::Value;

use super::conn::{Conns, Listener, Replies, redis_error};
use super::decide::{self, Record};
use crate::error::{Error, Result};

/// The probe's short extra read after an empty non-blocking one.
const GRACE: Duration = Duration::from_millis(5);

/// What a probe found.
#[derive(Debug)]
pub(super) enum Probe {
    /// Every counted participant answered (the prober's own record included when it is
    /// subscribed).
    Conclusive(Vec<Record>),
    /// The count changed, somebody stayed silent (and was reaped, where allowed), or the
    /// listener failed.
    Inconclusive,
    /// This many counted subscribers stayed silent and none of them is a lock holder (no
    /// holder's connection name): nothing can reap them, and nobody can lock the channel
    /// until they go.
    Foreign(u64),
}

/// The timings a probe uses.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    /// How long replies are waited for (the prober's `unavailable_timeout`).
    pub(super) unavailable: Duration,
    /// How often a subscription pings the server on its own connection.
    pub(super) health_check: Duration,
}

impl Timing {
    /// The poll interval: `min(0.1 s, U / 10)`.
    pub(super) fn poll(self) -> Duration {
        (self.unavailable / 10).min(Duration::from_millis(100))
    }

    /// How long a holder's lock certainly lasts after its last confirmed self-check: a prober
    /// with the same `unavailable_timeout` kills it no sooner than that after a ping it left
    /// unanswered; a tenth less, for the prober's and this process's timers.
    pub(super) fn lease(self) -> Duration {
        self.unavailable - self.unavailable / 10
    }

    /// How often a holder checks itself: four times per lease, so that a lease reported is
    /// never shorter than about two thirds of it while all is well.
    pub(super) fn self_check(self) -> Duration {
        self.unavailable / 4
    }
}

/// `x × U[0.5, 1.5)`: every pause of the protocol is jittered so, that contenders never fall
/// into lockstep.
pub(super) fn jitter(x: Duration) -> Duration {
    x.mul_f64(rand::rng().random_range(0.5..1.5))
}

/// A fresh `<32 lowercase hex>`.
pub(super) fn random_hex() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `PUBSUB NUMSUB channel`.
pub(super) async fn numsub(conns: &Conns, channel: &str) -> Result<u64> {
    let mut conn = conns.command().await?;
    let reply: Vec<Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut conn)
        .await
        .map_err(|e| redis_error("cannot count the lock channel's subscribers", &e))?;
    match reply.get(1) {
        Some(Value::Int(n)) => Ok(u64::try_from(*n).unwrap_or(0)),
        _ => Err(Error::storage(
            "PUBSUB NUMSUB gave an answer without a count",
        )),
    }
}

/// Publishes the ping with the channel's count taken in the same transaction: the count of
/// exactly the subscribers the ping reached. A count taken before the ping (the pre-check) can
/// match by chance while one subscriber came and another went, and a probe that stops at
/// `expected` replies would then decide on a view without the one it missed (a reader that
/// came in counted in the place of the writer that holds).
async fn publish_counted(conns: &Conns, channel: &str, response_channel: &str) -> Result<u64> {
    let mut conn = conns.command().await?;
    let (counted, _): (Vec<Value>, Value) = redis::pipe()
        .atomic()
        .cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .cmd("PUBLISH")
        .arg(channel)
        .arg(decide::ping(response_channel))
        .query_async(&mut conn)
        .await
        .map_err(|e| redis_error("cannot ping the lock channel", &e))?;
    match counted.get(1) {
        Some(Value::Int(n)) => Ok(u64::try_from(*n).unwrap_or(0)),
        _ => Err(Error::storage(
            "PUBSUB NUMSUB gave an answer without a count",
        )),
    }
}

/// Probes `channel` expecting `expected` participants (the prober included, when it is one).
/// With `reap`, counted participants that stay silent for the whole wait are killed.
///
/// # Cancel safety
///
/// Dropped mid-flight, the response subscription goes; a kill already sent stays sent.
pub(super) async fn probe(
    conns: &Arc<Conns>,
    timing: Timing,
    channel: &str,
    expected: u64,
    reap: bool,
) -> Result<Probe> {
    let response_channel = format!("{channel}-{}", random_hex());
    let listener = conns.listener().await?;
    let Ok(replies) = tokio::time::timeout(
        timing.unavailable,
        listener.replies(response_channel.clone()),
    )
    .await
    else {
        return Ok(Probe::Inconclusive);
    };
    let mut replies = replies?;
    let asked = tokio::time::Instant::now();
    if numsub(conns, channel).await? != expected {
        return Ok(Probe::Inconclusive);
    }
    // How long a membership check takes here: one is made in the wait only while it can end
    // before the deadline.
    let check = asked.elapsed();
    if publish_counted(conns, channel, &response_channel).await? != expected {
        return Ok(Probe::Inconclusive);
    }

    let Some(records) = gather_replies(
        conns,
        &listener,
        &mut replies,
        timing,
        channel,
        expected,
        check,
    )
    .await?
    else {
        return Ok(Probe::Inconclusive);
    };
    drop(replies);
    if numsub(conns, channel).await? != expected {
        return Ok(Probe::Inconclusive);
    }
    if (records.len() as u64) < expected {
        if reap && reap_silent(conns, channel, &records).await? == 0 {
            return Ok(Probe::Foreign(expected - records.len() as u64));
        }
        return Ok(Probe::Inconclusive);
    }
    Ok(Probe::Conclusive(records.into_values().collect()))
}

/// Takes the replies to the ping until the `expected` ones came or the wait ran out, then
/// those still unread. `None` when the probe cannot conclude: the listener failed, somebody
/// came or went (seen by a membership check, which takes `check`), or the prober came too
/// late to judge who is silent.
async fn gather_replies(
    conns: &Conns,
    listener: &Listener,
    replies: &mut Replies,
    timing: Timing,
    channel: &str,
    expected: u64,
    check: Duration,
) -> Result<Option<BTreeMap<String, Record>>> {
    let deadline = tokio::time::Instant::now() + timing.unavailable;
    let mut records: BTreeMap<String, Record> = BTreeMap::new();
    let mut legacy = 0usize;
    let mut take = |payload: Vec<u8>, records: &mut BTreeMap<String, Record>| {
        let record = decide::classify(&payload, legacy);
        if record.legacy {
            legacy += 1;
        }
        records.insert(record.holder_id.clone(), record);
    };
    while (records.len() as u64) < expected {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        let missing = expected - records.len() as u64;
        let read = read_replies(replies, timing.poll().min(left), missing, &mut |p| {
            take(p, &mut records);
        })
        .await;
        if read.is_err() {
            return Ok(None);
        }
        // Churn: somebody came or went (never a reason to reap). Checked while a check can end
        // before the deadline; the check after the barrier (below, then in `probe`) covers the
        // rest. A check running past the deadline would make a prober far from the server (a
        // round trip longer than its poll interval) late every time, and it would never reap.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if (records.len() as u64) < expected
            && left > check
            && numsub(conns, channel).await? != expected
        {
            return Ok(None);
        }
    }
    if (records.len() as u64) < expected {
        let late = tokio::time::Instant::now().saturating_duration_since(deadline);
        let Some(unread) = unread_replies(listener, replies, late, timing).await else {
            return Ok(None);
        };
        for payload in unread {
            take(payload, &mut records);
        }
    }
    Ok(Some(records))
}

/// Waits up to `wait` for a reply; once one came, takes what is buffered and what follows
/// within a short grace, up to `missing` replies. `Err` when the listener failed.
async fn read_replies(
    replies: &mut Replies,
    wait: Duration,
    missing: u64,
    take: &mut (dyn FnMut(Vec<u8>) + Send),
) -> std::result::Result<(), ()> {
    let Some(first) = replies.next(wait).await? else {
        return Ok(());
    };
    take(first);
    let mut taken = 1u64;
    // What is buffered, then one short grace read.
    while taken < missing {
        let payload = match replies.ready()? {
            Some(payload) => payload,
            None => match replies.next(GRACE).await? {
                Some(payload) => payload,
                None => break,
            },
        };
        take(payload);
        taken += 1;
    }
    Ok(())
}

/// Answers missing at the deadline: some the server sent in time may still be unread, when the
/// prober or the connection's reader resumed late on a busy machine. A round trip on the
/// listener's connection (bounded by the wait itself) brings in everything sent before it;
/// those are returned. `None` when the prober came `late` past its own deadline by more than a
/// poll interval (it stalled, and the holders it waited for may have stalled with it): it has
/// no fair view of who is silent, and must reap nobody.
async fn unread_replies(
    listener: &Listener,
    replies: &mut Replies,
    late: Duration,
    timing: Timing,
) -> Option<Vec<Vec<u8>>> {
    if late > timing.poll() {
        return None;
    }
    match tokio::time::timeout(timing.unavailable, listener.barrier()).await {
        Ok(Ok(())) => {}
        _ => return None,
    }
    let mut unread = Vec::new();
    while let Some(payload) = replies.ready().ok()? {
        unread.push(payload);
    }
    Some(unread)
}

/// Kills the channel's holder connections whose ids did not reply (and the legacy name, when no
/// legacy holder replied). Unnamed and foreign connections are never touched. How many were
/// killed.
async fn reap_silent(
    conns: &Conns,
    channel: &str,
    records: &BTreeMap<String, Record>,
) -> Result<usize> {
    let responding: Vec<String> = records
        .values()
        .filter(|r| !r.legacy)
        .map(|r| r.holder_id.clone())
        .collect();
    let legacy_replied = records.values().any(|r| r.legacy);
    let mut conn = conns.command().await?;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .map_err(|e| redis_error("cannot list clients to reap a silent holder", &e))?;
    let targets = decide::reap_targets(channel, &list, &responding, legacy_replied);
    for &id in &targets {
        tracing::info!(target: crate::logging::TARGET, channel, client = id,
            "killing a lock holder's connection that does not answer pings");
        let _: Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(&mut conn)
            .await
            .map_err(|e| redis_error("cannot kill a silent holder's connection", &e))?;
    }
    Ok(targets.len())
}

/// The error for a channel that subscribers which are not lock holders keep blocked.
pub(super) fn foreign(silent: u64) -> Error {
    Error::storage(format!(
        "{silent} subscriber(s) of the lock channel do not answer pings and are not lock holders \
         (no holder's connection name, so none can be reaped): nobody can take the lock until \
         they unsubscribe"
    ))
}

/// Who is on `channel`, without subscribing to it and without reaping: probes until one is
/// conclusive, for up to `patience`.
///
/// # Cancel safety
///
/// Cancel-safe: it changes nothing.
pub(super) async fn read_only(
    conns: &Arc<Conns>,
    timing: Timing,
    channel: &str,
    patience: Duration,
) -> Result<Vec<Record>> {
    let start = tokio::time::Instant::now();
    loop {
        let expected = numsub(conns, channel).await?;
        if expected == 0 {
            return Ok(Vec::new());
        }
        match probe(conns, timing, channel, expected, false).await? {
            Probe::Conclusive(records) => return Ok(records),
            Probe::Inconclusive | Probe::Foreign(_) => {}
        }
        if start.elapsed() >= patience {
            return Err(Error::storage(format!(
                "{expected} subscriber(s) on the lock channel, and not all of them answer pings \
                 (a holder that is stuck, or a subscriber that is not a lock holder)"
            ))
            .temporary());
        }
        tokio::time::sleep(jitter(timing.poll())).await;
    }
}
