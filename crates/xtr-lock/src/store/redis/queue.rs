//! The wait queue's Lua helpers and scripts: who is woken, who may go first, who leaves.
//!
//! The queue (a sorted set no peer reads, at a key no resource can name) holds tickets: the
//! mode (`w` or `r`), the holder's token (44 characters), the waiting store's wake channel id
//! (22 characters) and a number the store tells its waiters apart by. Scores are when each
//! wait began (µs, the waiter's clock), so waiters are served in arrival order, and in the
//! same order on every server of a quorum.
//!
//! **Fair by default.** A ticket stays queued until its waiter gets in or leaves: a woken
//! waiter keeps its place while its save is on the way. A save that is not already a holder's
//! (a re-save, a promotion, a demotion) is admitted only when no live waiter queued before it
//! stands in its way: for a writer any waiter, for a reader a writer. So a newcomer (a
//! `try_acquire`, or a wait's first attempt) never takes a free lock past a waiter, a waiting
//! writer stops the readers that came after it, and readers queued together get in together.
//! A ticket is live while its process listens on its wake channel; others are dropped on the
//! way. A store opened with `fair=false` passes `b` in `ARGV[7]` of its saves: its newcomers
//! may go first (barging), as before this queue was fair.
//!
//! A waiter that leaves without getting in (its wait timed out, its future was dropped) takes
//! its ticket out with `LEAVE`, which wakes who comes next. A wake that finds its waiter gone
//! (the process still runs, the waiter does not) is passed on with `WAKE`, which drops that
//! ticket first. A save that a queued waiter keeps out of a free lock wakes the head again (a
//! wake can be lost with a connection): a ticket whose waiter is gone is then passed on, so
//! no stale ticket holds a free lock for longer than the hint such a refusal gives
//! (`queue_recheck`, 250 ms).

/// The queue's helpers, after the shared ones (`PRELUDE`) and before a script's body.
pub(super) const QUEUE_PRELUDE: &str = r#"
-- How long (ms) a save kept out of a free lock by a queued waiter waits before it looks again:
-- the head normally takes the lock within a round trip, and its release wakes the next; this
-- bounds what a head whose wake went missing costs the others.
local function queue_recheck() return 250 end
-- What a save that found the key empty reads it as (see `scan`): nobody to wait for.
local function free_lock() return {live = 0, mine = false, writing = false, first = false, told = 1} end
-- Tells a waiter: the reply is how many connections heard it (0: its process is gone). The
-- last argument says how: `P` and the channel's head (PUBLISH, one server), or `S` and the
-- sharded channel's head in the keys' slot (SPUBLISH, a cluster); the waiter's store id ends
-- the channel.
-- A grant's wake (see `grant`) says more than who: `payload` replaces the ticket's tail.
local function wake(ticket, key, payload)
  local how = ARGV[#ARGV]
  local publish = 'PUBLISH'
  if string.sub(how, 1, 1) == 'S' then publish = 'SPUBLISH' end
  return redis.call(publish, string.sub(how, 2) .. string.sub(ticket, 46, 67),
    (payload or string.sub(ticket, 46)) .. ' ' .. key)
end
-- Tells this library's observers of `key` (`watch_changes`) that its holders changed: a
-- PUBLISH on `<wake head>obs:<key>`, or on a cluster an SPUBLISH on the sharded channel of the
-- keys' slot (one that nobody hears costs a lookup). Called after the script's writes, and a
-- refusal (an ACL user without channel rights: NOPERM) is ignored: observers then poll.
local function observed(key)
  local how = ARGV[#ARGV]
  local publish = 'PUBLISH'
  if string.sub(how, 1, 1) == 'S' then publish = 'SPUBLISH' end
  redis.pcall(publish, string.sub(how, 2) .. 'obs:' .. key, '')
end
-- How many connections listen for a ticket's wakes (0: its process is gone), on this node: its
-- store's channel, or its sharded channel of this slot (see `wake`).
local function listeners(ticket)
  local how = ARGV[#ARGV]
  local channel = string.sub(how, 2) .. string.sub(ticket, 46, 67)
  if string.sub(how, 1, 1) == 'S' then
    return redis.call('PUBSUB', 'SHARDNUMSUB', channel)[2]
  end
  return redis.call('PUBSUB', 'NUMSUB', channel)[2]
end
-- A lock held by one reader only: if that reader waits to write (a promotion, which no queued
-- waiter keeps out), it is woken, wherever its ticket stands among the first 64.
local function wake_promotion(key, qkey, now)
  local live = redis.call('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'LIMIT', 0, 2)
  if #live ~= 1 or live[1] == '__write__' then return end
  for _, t in ipairs(redis.call('ZRANGE', qkey, 0, 63)) do
    if string.sub(t, 1, 1) == 'w' and string.sub(t, 2, 45) == live[1] then
      wake(t, key)
      return
    end
  end
end
-- Direct hand-off: a free lock goes to the writer whose ticket `t` heads the queue, when the
-- ticket asks for it (it ends in `:<ttl ms>`), its process listens, and the script reads the
-- server's clock: its token is written as the writer's for its ttl, with the next fencing
-- token and a record marked as granted (`rkey`: a record key of this lock, a holder's token
-- ending it; `fkey`: the fencing counter; both nil where a script only wakes), and the ticket
-- leaves the queue. Returns the wake's payload (`<ticket tail>;<fence>;<clock µs>;<token>`),
-- or nil: wake it without a grant. Its callers tell the observers (once, after their writes).
local function grant(key, qkey, rkey, fkey, t)
  if not fkey or ARGV[1] ~= '' or string.sub(t, 1, 1) ~= 'w' then return nil end
  local ttl = tonumber(string.match(t, ':(%d+)$'))
  if not ttl or listeners(t) == 0 then return nil end
  local fence = next_fence(fkey)
  if not fence then return nil end
  local token, at = string.sub(t, 2, 45), now_us()
  local now = math.floor(at / 1000)
  local score = now + ttl
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, score, token, score, '__write__')
  redis.call('PEXPIREAT', key, score)
  put_record(string.sub(rkey, 1, -45) .. token, false, fence, score, '', true)
  redis.call('ZREM', qkey, t)
  return string.format('%s;%d;%d;%s', string.sub(t, 46), fence, at, token)
end
-- After a release, a demotion or a waiter's leaving: wakes the first waiting writer if the
-- lock is free, or the waiting readers up to the first live writer if the first waiter reads
-- and no writer holds. Woken tickets stay queued (their saves take them out). `gone`: the
-- caller removed the lock's last member, so the key is not read again (on a cluster slot being
-- migrated, Redis refuses a script's access to a key the source node no longer has, halfway
-- through it).
local function wake_next(key, qkey, now, gone, rkey, fkey)
  local first = redis.call('ZRANGE', qkey, 0, 0)[1]
  if not first then return end
  local writer = not gone and redis.call('ZSCORE', key, '__write__')
  if writer and tonumber(writer) > now then return end
  if string.sub(first, 1, 1) == 'r' then
    local dead = {}
    for _, t in ipairs(redis.call('ZRANGE', qkey, 0, 999)) do
      if string.sub(t, 1, 1) == 'r' then
        if wake(t, key) == 0 then dead[#dead + 1] = t end
      elseif listeners(t) > 0 then
        break
      else
        dead[#dead + 1] = t
      end
    end
    if #dead > 0 then redis.call('ZREM', qkey, unpack(dead)) end
    return
  end
  if not gone and redis.call('ZCOUNT', key, '(' .. now, '+inf') > 0 then
    return wake_promotion(key, qkey, now)
  end
  -- Bounded: tickets of processes that went away are dropped on the way.
  for _ = 1, 64 do
    local granted = grant(key, qkey, rkey, fkey, first)
    if granted then
      wake(first, key, granted)
      return
    end
    if wake(first, key) > 0 then return end
    redis.call('ZREM', qkey, first)
    first = redis.call('ZRANGE', qkey, 0, 0)[1]
    if not first then return end
    if string.sub(first, 1, 1) == 'r' then return wake_next(key, qkey, now, gone, rkey, fkey) end
  end
end
-- A grant to `token` of the lock `KEYS[1]` that may not have been taken in: its record (at
-- the key `KEYS[3]`, a record of this lock, names with the token replaced) still says granted
-- (a save rewrites it) and the token holds. The record, its key and the entry's score; or nil.
local function untaken_grant(token)
  local rkey = string.sub(KEYS[3], 1, -45) .. token
  local rec = redis.call('GET', rkey)
  if not (rec and string.find(rec, '"g":1', 1, true)) then return nil end
  local score = redis.call('ZSCORE', KEYS[1], token)
  if not score then return nil end
  return rec, rkey, score
end
-- Takes a grant back as a release would: the entry and its record go, the next waiter is woken
-- (or granted the lock).
local function take_back(token, rkey)
  redis.call('ZREM', KEYS[1], token, '__write__')
  redis.call('DEL', rkey)
  wake_next(KEYS[1], KEYS[2], now_ms(), false, KEYS[3], KEYS[4])
  observed(KEYS[1])
end
-- The tickets queued before the caller (at most 1000): all of them for a newcomer (`ARGV[4]`
-- empty), else those ranked before its ticket, or, if it is not queued, those whose wait
-- began before its own (`ARGV[5]`).
local function ahead(qkey)
  if ARGV[4] == '' then return redis.call('ZRANGE', qkey, 0, 999) end
  local rank = redis.call('ZRANK', qkey, ARGV[4])
  if rank == 0 then return {} end
  if rank then return redis.call('ZRANGE', qkey, 0, math.min(rank, 1000) - 1) end
  return redis.call('ZRANGEBYSCORE', qkey, '-inf', '(' .. ARGV[5], 'LIMIT', 0, 1000)
end
-- Whether a live waiter queued before the caller goes first: for a writer (`reading` false)
-- any, for a reader a writer. Tickets of processes that went away are dropped on the way.
-- Never, for a store that lets newcomers barge (`ARGV[7]` is `b`).
local function queued_first(qkey, reading)
  if ARGV[7] == 'b' then return false end
  local dead, live = {}, false
  -- The caller's own ticket in the other mode (a sibling's) is never ahead of it.
  local own = string.sub(ARGV[4], 2)
  for _, t in ipairs(ahead(qkey)) do
    if (own == '' or string.sub(t, 2) ~= own) and (not reading or string.sub(t, 1, 1) == 'w') then
      if listeners(t) > 0 then
        live = true
        break
      end
      dead[#dead + 1] = t
    end
  end
  if #dead > 0 then redis.call('ZREM', qkey, unpack(dead)) end
  return live
end
"#;

/// Passes a wake on: the waiter it named is gone (it gave up, or its process let go of it), so
/// its ticket (the one whose tail, from its store id on, is `ARGV[4]`, among the first 64)
/// leaves the queue and the next waiter is woken, as a release would wake it.
pub(super) const WAKE: &str = r#"
if ARGV[4] ~= '' then
  for _, t in ipairs(redis.call('ZRANGE', KEYS[2], 0, 63)) do
    if string.sub(t, 46) == ARGV[4] then redis.call('ZREM', KEYS[2], t) end
  end
end
wake_next(KEYS[1], KEYS[2], now_ms(), false, KEYS[3], KEYS[4])
observed(KEYS[1])
return 1
"#;

/// A waiter leaves the queue without getting in (`ARGV[4]`, its ticket); whoever that lets
/// in is woken (it may have been woken itself, and kept the others out meanwhile). If its
/// ticket is gone and asked for grants, a release may have granted it the lock with a wake that
/// never reached it (a dropped subscriber connection): a grant above the last token its waiter
/// took in (`ARGV[5]`) is taken back.
pub(super) const LEAVE: &str = r#"
if redis.call('ZREM', KEYS[2], ARGV[4], twin(ARGV[4]) or ARGV[4]) > 0 then
  wake_next(KEYS[1], KEYS[2], now_ms(), false, KEYS[3], KEYS[4])
  observed(KEYS[1])
elseif string.find(ARGV[4], ':%d+$') then
  local token = string.sub(ARGV[4], 2, 45)
  local rec, rkey = untaken_grant(token)
  local fence = rec and tonumber(string.match(rec, '"fence":(%d+)'))
  if fence and fence > tonumber(ARGV[5]) then take_back(token, rkey) end
end
return 1
"#;

/// Takes back a grant whose waiter is gone (it gave up, or its process let go of it, before
/// taking the grant in): the token `ARGV[4]`, while its entry is still the grant (its record
/// marked as granted, its score `ARGV[5]`: a re-save rewrites the one, a renewal the other),
/// is removed as a release removes it, and the next waiter is woken (or granted the lock).
/// Replies 1 if it took the grant back, else 0.
pub(super) const REVOKE: &str = r#"
local rec, rkey, score = untaken_grant(ARGV[4])
if not (rec and tonumber(score) == tonumber(ARGV[5])) then return 0 end
take_back(ARGV[4], rkey)
return 1
"#;
