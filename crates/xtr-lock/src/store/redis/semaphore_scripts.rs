//! The Lua scripts of counting semaphores, in Symfony Semaphore 5.4's layout (its
//! `Store/RedisStore.php`): per semaphore `<prefix>{<resource>}:time` (member = holder token,
//! score = when its lease ends, Unix **seconds**) and `<prefix>{<resource>}:weight` (member =
//! token, score = its permits), both expiring 10 s after the latest lease. Written for this
//! crate.
//!
//! Keys, for every script: `KEYS[1]` the time set, `KEYS[2]` the weight set, `KEYS[3]` our
//! stored limit (a string; Symfony neither reads nor writes it), `KEYS[4]` the fencing counter
//! (the store's, shared with locks), `KEYS[5]` the wait queue, `KEYS[6]` the holder's record
//! (as a lock holder's, see `scripts.rs`). Arguments: those of the lock scripts (`ARGV[1]`
//! clock, `ARGV[2]` token, `ARGV[3]` ms, `ARGV[4]` ticket, `ARGV[5]` when its wait began), then
//! `ARGV[6]` the holder's limit, `ARGV[7]` its permits and `ARGV[8]` its metadata.
//!
//! Scores are whole seconds, rounded up: Symfony's save and refresh `EXPIREAT` the highest
//! score + 10, which fails on a fractional score (after its writes). Rounding up makes our
//! lease last longer on the server than our holder believes, never shorter.
//!
//! Queue tickets of semaphore waiters are `s<token 44><channel id 22><number>.<permits>`:
//! waiters are served in the order their waits began, and nobody of ours passes a live earlier
//! waiter: a save leaves the permits of every earlier waiter that fits free for it, and takes
//! nothing while an earlier one does not fit. A release wakes the waiters that fit, in order,
//! up to the first that does not; woken waiters keep their ticket (and so their permits)
//! until their save admits them or they leave.

/// Helpers of the semaphore scripts (after the lock scripts' prelude, whose `now_ms`,
/// `now_us`, `announces` and `wake` they use).
pub(super) const SEM_PRELUDE: &str = r#"
-- A semaphore, pruned of ended leases (and of weights without a lease): `used` permits of
-- the other live holders, `holders` how many, the caller's lease end (`mine`, ms), the
-- earliest other lease end (`first`, ms), the latest lease end of all (`last`, s), and
-- whether every other holder announces its release (`told`). An empty time set costs one call.
local function sem_read(tkey, wkey, token, now)
  local r = {used = 0, holders = 0, mine = false, first = false, told = 1, last = 0}
  local times = redis.call('ZRANGE', tkey, 0, -1, 'WITHSCORES')
  if #times == 0 then return r end
  local live, stale = {}, false
  for i = 1, #times, 2 do
    local ends = tonumber(times[i + 1]) * 1000
    if ends <= now then stale = true else live[times[i]] = ends end
  end
  if stale then
    redis.call('ZREMRANGEBYSCORE', tkey, '-inf', string.format('%.3f', now / 1000))
  end
  local weights = redis.call('ZRANGE', wkey, 0, -1, 'WITHSCORES')
  local gone = {}
  for i = 1, #weights, 2 do
    local m = weights[i]
    local ends = live[m]
    if not ends then
      gone[#gone + 1] = m
    elseif m == token then
      r.mine, r.weight = ends, tonumber(weights[i + 1])
    else
      r.used = r.used + tonumber(weights[i + 1])
      r.holders = r.holders + 1
      if not announces(m) then r.told = 0 end
      if not r.first or ends < r.first then r.first = ends end
    end
    if ends and ends / 1000 > r.last then r.last = math.floor(ends / 1000) end
  end
  if #gone > 0 then redis.call('ZREM', wkey, unpack(gone)) end
  return r
end
-- The sets and the stored limit live 10 s past the latest lease, as Symfony's do.
local function sem_expire(tkey, wkey, lkey)
  local top = redis.call('ZRANGE', tkey, -1, -1, 'WITHSCORES')[2]
  if not top then return end
  local at = math.floor(tonumber(top)) + 10
  redis.call('EXPIREAT', tkey, at)
  redis.call('EXPIREAT', wkey, at)
  redis.call('EXPIREAT', lkey, at)
end
-- The permits a queued ticket waits for.
local function sem_count(t)
  return tonumber(string.match(t, '%.(%d+)$')) or 1
end
-- Whether the process of a queued ticket still listens on its wake channel.
local function sem_alive(t)
  return listeners(t) > 0
end
-- The permits left for the caller out of `avail` once the waiters queued before it are served
-- in order: a live earlier waiter that fits keeps its permits; one that does not fit leaves
-- nothing to anybody behind it. Tickets of processes that went away are dropped.
local function sem_ahead(qkey, avail)
  local tickets
  if ARGV[4] == '' then
    tickets = redis.call('ZRANGE', qkey, 0, 63)
  else
    local rank = redis.call('ZRANK', qkey, ARGV[4])
    if rank == 0 then return avail end
    if rank then
      tickets = redis.call('ZRANGE', qkey, 0, math.min(rank, 64) - 1)
    else
      tickets = redis.call('ZRANGEBYSCORE', qkey, '-inf', '(' .. ARGV[5], 'LIMIT', 0, 64)
    end
  end
  for _, t in ipairs(tickets) do
    if avail <= 0 then return 0 end
    if not sem_alive(t) then
      redis.call('ZREM', qkey, t)
    elseif sem_count(t) > avail then
      return 0
    else
      avail = avail - sem_count(t)
    end
  end
  return avail
end
-- After permits came free: wakes the queued waiters that fit, in order, up to the first that
-- does not (their tickets stay queued until they get in or leave). The limit is the stored
-- one, else the caller's (`ARGV[6]`); without either, the first waiter is woken.
local function sem_wake(tkey, wkey, lkey, qkey, now)
  local tickets = redis.call('ZRANGE', qkey, 0, 63)
  if #tickets == 0 then return end
  local r = sem_read(tkey, wkey, '', now)
  local limit = tonumber(redis.call('GET', lkey)) or tonumber(ARGV[6])
  local avail = limit and (limit - r.used) or sem_count(tickets[1])
  for _, t in ipairs(tickets) do
    if sem_count(t) > avail then
      if sem_alive(t) then return end
      redis.call('ZREM', qkey, t)
    elseif wake(t, tkey) > 0 then
      avail = avail - sem_count(t)
    else
      redis.call('ZREM', qkey, t)
    end
  end
end
"#;

/// Takes the permits (nine calls on a free semaphore nobody waits for): prune, check the
/// stored limit, serve earlier waiters first, admit if
/// `used + count <= limit`. Replies `{1, fence, 0}` (fence 0: a re-save that keeps its
/// token), `{0, ms until another lease ends or -1, 1 if the waiter was queued and every holder
/// announces its release}`, `{-2, stored limit, 0}` when the holders use another limit, or
/// `{-3, permits held, 0}` when the holder asks again for another count.
pub(super) const SAVE: &str = r#"
local tkey, wkey, lkey, fkey, qkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, dur = ARGV[2], tonumber(ARGV[3])
local limit, count = tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_ms()
local r = sem_read(tkey, wkey, token, now)
if r.holders > 0 or r.mine then
  local stored = tonumber(redis.call('GET', lkey))
  if stored and stored ~= limit then return {-2, stored, 0} end
end
-- A holder's count never changes (a key edited on its travels).
if r.mine and r.weight ~= count then return {-3, r.weight, 0} end
if not r.mine and count > sem_ahead(qkey, limit - r.used) then
  local hint = -1
  if r.first then hint = math.max(r.first - now, 1) end
  -- Permits are free but kept for earlier waiters: look again within a second, in case one of
  -- them was woken and its process died before it came (nothing else would wake us then).
  if limit - r.used >= count and (hint < 0 or hint > 1000) then hint = 1000 end
  local told = 0
  if ARGV[4] ~= '' then
    redis.call('ZADD', qkey, 'NX', ARGV[5], ARGV[4])
    local keep = math.max(hint, 0) + 60000
    if redis.call('PTTL', qkey) < keep then redis.call('PEXPIRE', qkey, keep) end
    told = r.told
  end
  return {0, hint, told}
end
local fence = 0
if not r.mine then
  local err
  fence, err = next_fence(fkey)
  if err then return err end
end
local ends = math.ceil((now + dur) / 1000)
redis.call('ZADD', tkey, ends, token)
redis.call('ZADD', wkey, count, token)
-- The sets and the limit live 10 s past the latest lease (`last` is the others', whole).
local at = math.max(ends, r.last) + 10
redis.call('EXPIREAT', tkey, at)
redis.call('EXPIREAT', wkey, at)
redis.call('SET', lkey, limit, 'EX', math.max(at - math.floor(now / 1000), 1))
put_record(KEYS[6], r.mine, fence, ends * 1000, ARGV[8])
if ARGV[4] ~= '' then redis.call('ZREM', qkey, ARGV[4]) end
return {1, fence, 0}
"#;

/// Refresh: a live lease is extended with its record; an ended one is removed with it, never
/// revived. Replies 2
/// (extended), 0 (nothing stored) or -1 (its lease had ended).
pub(super) const PUT_OFF: &str = r#"
local tkey, wkey, lkey = KEYS[1], KEYS[2], KEYS[3]
local token, dur = ARGV[2], tonumber(ARGV[3])
local ends = redis.call('ZSCORE', tkey, token)
if not ends then
  redis.call('ZREM', wkey, token)
  redis.call('DEL', KEYS[6])
  return 0
end
local now = now_ms()
if tonumber(ends) * 1000 <= now then
  redis.call('ZREM', tkey, token)
  redis.call('ZREM', wkey, token)
  redis.call('DEL', KEYS[6])
  sem_expire(tkey, wkey, lkey)
  return -1
end
local until_s = math.ceil((now + dur) / 1000)
redis.call('ZADD', tkey, until_s, token)
redis.call('PEXPIREAT', KEYS[6], until_s * 1000)
sem_expire(tkey, wkey, lkey)
return 2
"#;

/// Release: token-scoped. Replies 0 (held nothing), 1 (released a live lease) or 2 (removed an
/// ended one). Wakes the waiters that now fit. Five calls where nobody waits.
pub(super) const DELETE: &str = r#"
local tkey, wkey, lkey, qkey = KEYS[1], KEYS[2], KEYS[3], KEYS[5]
local token = ARGV[2]
local ends = redis.call('ZSCORE', tkey, token)
redis.call('ZREM', wkey, token)
redis.call('DEL', KEYS[6])
if not ends then return 0 end
-- The keys keep their expiry: it covers the other holders' leases already.
redis.call('ZREM', tkey, token)
local now = now_ms()
sem_wake(tkey, wkey, lkey, qkey, now)
if tonumber(ends) * 1000 <= now then return 2 end
return 1
"#;

/// A waiter leaves the queue (`ARGV[4]`, its ticket), and the waiters behind it that now fit
/// are woken (it may have been woken, and kept their permits, without taking its own).
pub(super) const LEAVE: &str = r#"
if redis.call('ZREM', KEYS[5], ARGV[4]) == 1 then
  sem_wake(KEYS[1], KEYS[2], KEYS[3], KEYS[5], now_ms())
end
return 1
"#;

/// What does the holder hold? 2 (a live lease), 0 (nothing), -1 (its lease ended). Read-only.
pub(super) const EXISTS_BODY: &str = r#"
local ends = redis.call('ZSCORE', KEYS[1], ARGV[2])
if not ends then return 0 end
if tonumber(ends) * 1000 <= now_ms() then return -1 end
return 2
"#;

/// The semaphore scripts, each with the helpers it calls.
pub(super) struct SemScripts {
    pub(super) save: redis::Script,
    pub(super) put_off: redis::Script,
    pub(super) delete: redis::Script,
    pub(super) leave: redis::Script,
    pub(super) exists: redis::Script,
    pub(super) exists_legacy: redis::Script,
}

impl SemScripts {
    pub(super) fn new() -> Self {
        let prelude = format!("{}{SEM_PRELUDE}", super::scripts::all_helpers());
        let body = |b: &str| format!("{}{b}", super::prelude::prelude_from(&prelude, b));
        SemScripts {
            save: redis::Script::new(&body(SAVE)),
            put_off: redis::Script::new(&body(PUT_OFF)),
            delete: redis::Script::new(&body(DELETE)),
            leave: redis::Script::new(&body(LEAVE)),
            exists: redis::Script::new(&format!("#!lua flags=no-writes\n{}", body(EXISTS_BODY))),
            exists_legacy: redis::Script::new(&body(EXISTS_BODY)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_semaphore_script_carries_the_helpers_it_calls() {
        let prelude = format!("{}{SEM_PRELUDE}", super::super::scripts::all_helpers());
        let delete = super::super::prelude::prelude_from(&prelude, DELETE);
        for helper in [
            "sem_wake",
            "sem_read",
            "announces",
            "wake",
            "sem_alive",
            "now_ms",
        ] {
            assert!(
                delete.contains(&format!("local function {helper}(")),
                "{helper}"
            );
        }
        let save = super::super::prelude::prelude_from(&prelude, SAVE);
        for helper in ["sem_ahead", "sem_count", "now_us", "sem_read"] {
            assert!(
                save.contains(&format!("local function {helper}(")),
                "{helper}"
            );
        }
        assert!(!save.contains("local function sem_wake("));
    }
}
