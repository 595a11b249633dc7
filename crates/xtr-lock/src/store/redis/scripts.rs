//! The Lua scripts: one atomic script per operation on one lock key, in the sorted-set layout
//! shared with Python xtr-lock 4.1.0 and Symfony Lock. Written for this crate.
//!
//! Arguments, for every script: `KEYS[1]` the lock key (prefix + resource); `ARGV[1]` the client's
//! Unix time in seconds, or `""` to read the server's `TIME`; `ARGV[2]` the holder's token;
//! `ARGV[3]` a duration in ms; `ARGV[4]` the waiter's ticket (`""`: the caller does not wait);
//! `ARGV[5]` when its wait began (µs, the waiter's clock); the last `ARGV`, how to wake a
//! waiter (see `wake`). The saves take `KEYS[2]`, the fencing
//! counter, `KEYS[3]`, the resource's wait queue, and `KEYS[4]`, the holder's record, with
//! `ARGV[6]` its metadata (`""`: none; else `m` and the base64 of the bytes); delete, wake,
//! leave and revoke take `KEYS[2]`, the queue, `KEYS[3]`, the record, and `KEYS[4]`, the fencing
//! counter (a release may grant the lock: `grant`); refresh takes `KEYS[2]`, the record.
//!
//! The holder's record (`HolderRecord`'s JSON: metadata, when it acquired on the script's
//! clock, the fencing token) is a string at a key no resource can name, one per holder, written
//! by the save that admits it and expiring at its lease's end (refreshed with it, deleted with
//! it), so a record never outlives its holder's entry; peers never see it.
//!
//! The wait queue (a sorted set no peer reads, at a key no resource can name) holds tickets:
//! the mode (`w` or `r`), the holder's token (44 characters) and the waiting store's wake
//! channel id (22 characters) with a number the store tells its waiters apart by. Scores are
//! when each wait began, so waiters are served in arrival order, and in the same order on every
//! server of a quorum. A refused save of a waiter enqueues its ticket in the same script that
//! refused it, so no release can fall between the two; a release wakes the first writer, or
//! every waiting reader, by publishing on the waiter's channel, skipping tickets whose channel
//! nobody listens to (a process that went away).
//!
//! Members are only holder tokens and `__write__`: the peers decide admission by counting
//! members, so nothing else may go in the set. A sorted set with any other member is not a lock
//! (an application's leaderboard at a key that happens to be a resource's name): the saves
//! refuse it before they touch it, and the other scripts only ever remove the holder's own
//! token, so such data is never modified.
//!
//! The scripts that write check everything that can fail before their first write: Lua scripts
//! are not transactions, so a command that fails half-way leaves the writes before it in place.
//!
//! What a holder holds is answered by one code, shared by `exists` and `put_off`: 2 writes,
//! 1 reads, 0 nothing stored (removed), -1 its entry's lease had ended (expired), -2 another
//! holder holds it now (taken over).

/// Shared helpers, prepended to each script.
pub(super) const PRELUDE: &str = r#"
-- The clock in microseconds: the server's TIME, read once per script, or the client's.
local clock_us
local function now_us()
  if not clock_us then
    if ARGV[1] ~= '' then
      clock_us = math.floor(tonumber(ARGV[1]) * 1000000)
    else
      local t = redis.call('TIME')
      clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
  end
  return clock_us
end
-- Integer ms, as the peers compute them.
local function now_ms()
  if ARGV[1] ~= '' then return math.floor(tonumber(ARGV[1]) * 1000) end
  return math.floor(now_us() / 1000)
end
-- The fencing counter's value (0 if missing); nil and the error for a key of another type.
local function last_fence(fence_key)
  local last = redis.pcall('GET', fence_key)
  if type(last) == 'table' and last.err then return nil, last end
  return tonumber(last) or 0
end
-- Advances the fencing counter to one past the last token, and never below the clock in µs:
-- tokens keep rising across a restart that lost the counter and across a fail-over to a replica
-- that had not yet received its latest value (while clocks agree to within the fail-over's
-- time). Nil and the error for a key of another type (checked before anything is written).
local function next_fence(fence_key)
  local fence = redis.pcall('INCR', fence_key)
  if type(fence) == 'table' and fence.err then return nil, fence end
  local floor = now_us()
  if fence < floor then
    fence = floor
    redis.call('SET', fence_key, string.format('%d', fence))
  end
  return fence
end
local function key_type(key) return redis.call('TYPE', key)['ok'] end
-- Runs a sorted-set read; on a key of another type, a string (someone else's lock in another
-- format) gives `refusal`, anything else the server's WRONGTYPE error. The common path pays no
-- TYPE call.
local function zcall(refusal, ...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    if key_type(KEYS[1]) == 'string' then return nil, refusal end
    return nil, reply
  end
  return reply
end
-- The key lives as long as its longest-lived member (it may be in the past: then it goes now).
local function expire_at_max(key)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] then redis.call('PEXPIREAT', key, top[2]) end
end
-- What a holder without a live entry of its own lost to: -2 when someone else holds, else 0.
local function absent_code(key, now)
  if redis.call('ZCOUNT', key, '(' .. now, '+inf') > 0 then return -2 end
  return 0
end
-- Whether a holder's token says it announces its release (it ends in the base64 of
-- `xtr-wake`: tokens made by this library).
local function announces(m) return string.sub(m, -12) == 'eHRyLXdha2U=' end
-- Reads a lock that has members, in one call: nil when a member is neither a holder's token
-- nor the marker (not a lock); else what a save needs, expired entries pruned first (only if
-- there are any): `live` holders (the marker not counted), the caller's own score (`mine`),
-- the marker's (`writing`), the earliest lease of another holder (`first`), and whether every
-- other live holder announces its release (`told`).
local function scan(key, token, now)
  local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local r = {live = 0, mine = false, writing = false, first = false, told = 1}
  local expired = false
  for i = 1, #all, 2 do
    local m, score = all[i], tonumber(all[i + 1])
    if m ~= '__write__' and not (#m == 44 and string.find(m, '^[%w+/]+=$')) then return nil end
    if score <= now then
      expired = true
    elseif m == '__write__' then
      r.writing = score
    else
      r.live = r.live + 1
      if m == token then
        r.mine = score
      else
        if not announces(m) then r.told = 0 end
        if not r.first or score < r.first then r.first = score end
      end
    end
  end
  if expired then redis.call('ZREMRANGEBYSCORE', key, '-inf', now) end
  return r
end
-- Extends `token`'s live entry in `key` (and its record at `rkey`) to now + `dur` ms: the
-- holding code; an expired entry is removed with its record, never revived. Nil and what to
-- answer instead for a key that is not a sorted set.
local function extend(key, rkey, token, dur)
  local mine, stop = zcall(-2, 'ZSCORE', key, token)
  if stop then return nil, stop end
  local now = now_ms()
  if not mine then
    redis.call('DEL', rkey)
    return absent_code(key, now)
  end
  local writing = redis.call('ZSCORE', key, '__write__')
  if tonumber(mine) <= now then
    redis.call('ZREM', key, token)
    if writing then redis.call('ZREM', key, '__write__') end
    redis.call('DEL', rkey)
    expire_at_max(key)
    return -1
  end
  local score = now + dur
  redis.call('ZADD', key, score, token)
  if writing then redis.call('ZADD', key, score, '__write__') end
  -- The record lives as long as the entry (a peer's refresh never touches it).
  redis.call('PEXPIREAT', rkey, score)
  expire_at_max(key)
  if writing then return 2 end
  return 1
end
-- The same waiter's ticket in the other mode (`w` and `r`; nil for a semaphore's): a waiter
-- has one ticket, of its latest save's mode, though sibling tasks of one holder may wait in
-- both modes.
local function twin(t)
  local tag = string.sub(t, 1, 1)
  if tag == 'w' then return 'r' .. string.sub(t, 2) end
  if tag == 'r' then return 'w' .. string.sub(t, 2) end
  return nil
end
-- A refusal, from what `scan` read: when to try again (ms until another holder's lease ends,
-- `recheck` when a queued waiter keeps the caller out of a free lock, else -1), whether the
-- holder keeps its read lock, and whether every current holder will announce its release to
-- the waiter (who then need not poll). A waiter's ticket is queued here, atomically with the
-- refusal; the queue lives an hour past the lease its newest waiter waits for.
local function refused(r, now, kept, recheck)
  local hint = -1
  if r.first then hint = math.max(r.first - now, 1) elseif recheck then hint = recheck end
  local told = 0
  if ARGV[4] ~= '' then
    -- A ticket already queued has no twin (each save keeps one of the two), and a poll beside
    -- a peer's holder pays for nothing more than this `ZADD`.
    if redis.call('ZADD', KEYS[3], 'NX', ARGV[5], ARGV[4]) == 1 then
      local other = twin(ARGV[4])
      if other then redis.call('ZREM', KEYS[3], other) end
      -- The queue outlives the lease its newest waiter waits behind by an hour; behind a lock
      -- renewed for longer, a waiter's refusal at that lease's end queues it again in its place.
      redis.call('PEXPIRE', KEYS[3], math.max(hint, 0) + 3600000)
    end
    told = r.told
  end
  return {0, hint, kept, told, now_us()}
end
-- Admitted: a waiter leaves the queue.
local function dequeue()
  if ARGV[4] ~= '' then redis.call('ZREM', KEYS[3], ARGV[4], twin(ARGV[4]) or ARGV[4]) end
end
-- Writes an admitted holder's record at `rkey`, expiring with its lease at `ends` (ms): its
-- metadata (`meta`: "" or `m` and base64), when it acquired and its fencing token. A holder that already held
-- (`mine`: a re-save, a promotion, a demotion) keeps its acquisition time, and its token where
-- this save gives none (0: a writer's re-save). Returns the token it recorded.
local function put_record(rkey, mine, fence, ends, meta, granted)
  local at = now_ms()
  if mine then
    local old = redis.call('GET', rkey)
    if old then
      at = tonumber(string.match(old, '"at_ms":(%d+)')) or at
      if fence == 0 then fence = tonumber(string.match(old, '"fence":(%d+)')) or 0 end
    end
  end
  local rec = '{"v":1,"at_ms":' .. string.format('%d', at)
  if meta ~= '' then rec = rec .. ',"meta":"' .. string.sub(meta, 2) .. '"' end
  if fence > 0 then rec = rec .. ',"fence":' .. string.format('%d', fence) end
  -- A grant the release wrote (see `grant`): its waiter has not taken it in yet.
  if granted then rec = rec .. ',"g":1' end
  redis.call('SET', rkey, rec .. '}')
  redis.call('PEXPIREAT', rkey, ends)
  return fence
end
"#;

/// Write lock: re-save by the writer, promotion of the sole reader, or a new writer on an empty
/// set (after pruning). Replies `{1, fence, 0, 0}` (a writer's re-save: the token it holds, 0
/// if its record is gone), `{0, ms until another lease ends or -1, 1 if the holder keeps its
/// read lock else 0, 1 if the waiter was queued and every holder announces its release else 0,
/// the script's clock in µs}`, or
/// `{-1, 0, 0, 0}` for a sorted set that is not a lock. A string at the key refuses (someone
/// else's lock in another format); another type fails with WRONGTYPE.
///
/// The fencing token is the counter, advanced, and never below the server's clock in
/// microseconds (`next_fence`), so tokens keep increasing across a restart that lost the counter
/// and a fail-over to a replica that lagged. The counter is advanced before anything else is written:
/// a counter key of the wrong type fails the save with nothing of the holder stored.
const SAVE: &str = r#"
local key, fence_key = KEYS[1], KEYS[2]
local token, dur = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local count, stop = zcall({0, -1, 0, 0}, 'ZCARD', key)
if stop then return stop end
local mine, writing = false, false
-- The common case, a free lock, pays no pruning and no lookups.
local r = free_lock()
if count > 0 then
  r = scan(key, token, now)
  if not r then return {-1, 0, 0, 0} end
  if r.live > 0 then
    mine, writing = r.mine, r.writing
    if not mine then return refused(r, now, 0) end
    -- A reader that is not alone keeps its read lock.
    if (not writing) and r.live > 1 then return refused(r, now, 1) end
  end
end
-- A free lock: a waiter queued before the caller goes first (and is woken again).
if not mine and queued_first(KEYS[3], false) then
  wake_next(key, KEYS[3], now, count == 0)
  return refused(r, now, 0, queue_recheck())
end
local fence = 0
if not (mine and writing) then
  -- The first write: if the counter cannot be advanced, nothing of this holder is stored.
  local err
  fence, err = next_fence(fence_key)
  if err then return err end
end
local score = now + dur
redis.call('ZADD', key, score, token, score, '__write__')
-- Admitted: the set is exactly {token, marker}, so the key lives as long as this score.
redis.call('PEXPIREAT', key, score)
-- A writer's re-save answers the token it holds (it may have been granted it by a release
-- whose wake has not reached it yet).
fence = put_record(KEYS[4], mine, fence, score, ARGV[6])
dequeue()
if not (mine and writing) then observed(key) end
return {1, fence, 0, 0}
"#;

/// Read lock: joins readers, or demotes the caller's write lock (and tells waiting readers).
/// Refused only when another holder writes (replies as the write save); `{-1, 0, 0, 0}` for a
/// sorted set that is not a lock. Replies `{1, token, 0, 0}` when admitted: a reader's fencing token is the counter as it stands
/// (the last writer's token), so every later writer's exceeds it (readers share tokens; a
/// resource that refuses tokens below the newest it saw then refuses a stale writer once a
/// later reader came).
const SAVE_READ: &str = r#"
local key, fence_key = KEYS[1], KEYS[2]
local token, dur = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
local count, stop = zcall({0, -1, 0, 0}, 'ZCARD', key)
if stop then return stop end
local fence, err = last_fence(fence_key)
if err then return err end
-- A missing counter is seeded from the clock (stored once admitted).
local seed = fence == 0
if seed then fence = now_us() end
local function admitted(mine)
  if seed then redis.call('SET', fence_key, string.format('%d', fence)) end
  put_record(KEYS[4], mine, fence, now + dur, ARGV[6])
  dequeue()
  if not mine then observed(key) end
  return {1, fence, 0, 0}
end
-- A waiter queued before the caller goes first if it writes (woken again if the lock is free).
local function writer_first(r)
  if not queued_first(KEYS[3], true) then return nil end
  if r.live == 0 then
    wake_next(key, KEYS[3], now, count == 0)
    return refused(r, now, 0, queue_recheck())
  end
  return refused(r, now, 0)
end
if count == 0 then
  local first = writer_first(free_lock())
  if first then return first end
  -- A free lock: the new entry is the only one, so the key lives exactly as long.
  redis.call('ZADD', key, now + dur, token)
  redis.call('PEXPIREAT', key, now + dur)
  return admitted(false)
end
local r = scan(key, token, now)
if not r then return {-1, 0, 0, 0} end
local mine, writing = r.mine, r.writing
if (not mine) and writing then return refused(r, now, 0) end
if not mine then
  local first = writer_first(r)
  if first then return first end
end
redis.call('ZADD', key, now + dur, token)
expire_at_max(key)
local result = admitted(mine)
-- A demotion lets waiting readers in.
if writing then
  redis.call('ZREM', key, '__write__')
  wake_next(key, KEYS[3], now)
  observed(key)
end
return result
"#;

/// Refresh: only a live member is extended, with its record; an expired one is removed with
/// its record, never revived (the Python peer's refresh revives a reader whose entry another
/// reader kept alive). Replies the holding code (2, 1: extended; 0, -1, -2: not held).
const PUT_OFF: &str = r#"
local code, stop = extend(KEYS[1], KEYS[2], ARGV[2], tonumber(ARGV[3]))
if stop then return stop end
return code
"#;

/// A release that leaves the holder's entry to run out: the refresh to now + `ARGV[3]` ms
/// (shortening it), with the queue (`KEYS[2]`) and the record (`KEYS[3]`) as a release takes
/// them. Every waiter is woken, so it learns when the entry now ends (its last refusal said
/// when the longer lease did): out of the queue, as a release takes it; its next refused save
/// queues it again in its place (the score is when its wait began). Replies the holding code.
const RELEASE_AFTER: &str = r#"
local code, stop = extend(KEYS[1], KEYS[3], ARGV[2], tonumber(ARGV[3]))
if stop then return stop end
if code > 0 then
  for _, t in ipairs(redis.call('ZRANGE', KEYS[2], 0, 63)) do
    if wake(t, KEYS[1]) == 0 then redis.call('ZREM', KEYS[2], t) end
  end
  observed(KEYS[1])
end
return code
"#;

/// Release: token-scoped. Replies 0 (held nothing), 1 (released a live lock) or 2 (removed an
/// entry whose lease had already ended: the lock had been lost). Wakes the next waiter(s).
///
/// A writer's set is exactly {token, marker} and the key expires with its score (every script
/// that writes a writer's score sets the key's expiry to it), so on the server's clock a
/// writer's entry seen at all is live: removing both members removes the key, and neither
/// `TIME` nor a new expiry is needed. Readers (and every holder on the client's clock) compare.
const DELETE: &str = r#"
local key = KEYS[1]
local token = ARGV[2]
local score, stop = zcall(0, 'ZSCORE', key, token)
if stop then return stop end
-- The record goes with the entry (or alone, if the entry went first).
redis.call('DEL', KEYS[3])
if not score then return 0 end
local size = redis.call('ZCARD', key)
local removed = redis.call('ZREM', key, token, '__write__')
-- Once the last member went, the key is not touched again (see `wake_next`).
local gone = removed == size
if removed == 2 and ARGV[1] == '' then
  -- The writer's key is gone: nobody holds, so no clock is needed to wake the next.
  wake_next(key, KEYS[2], 0, gone, KEYS[3], KEYS[4])
  observed(key)
  return 1
end
if removed < 2 and not gone then expire_at_max(key) end
local now = now_ms()
wake_next(key, KEYS[2], now, gone, KEYS[3], KEYS[4])
observed(key)
if tonumber(score) <= now then return 2 end
return 1
"#;

/// What does the holder hold? Replies the holding code. Read-only: no pruning, so it runs on
/// replicas and needs no write permission (Redis ≥ 7 reads the flag; older servers get the same
/// body without it). A writer's set is exactly {token, marker}, so the marker beside a live
/// entry of the holder's is its own.
const EXISTS_BODY: &str = r#"
local key = KEYS[1]
local token = ARGV[2]
local score, stop = zcall(-2, 'ZSCORE', key, token)
if stop then return stop end
local now = now_ms()
if not score then return absent_code(key, now) end
if tonumber(score) <= now then return -1 end
if redis.call('ZSCORE', key, '__write__') then return 2 end
return 1
"#;

/// The time probe: can a script read `TIME` and then write? It writes a key no resource can
/// name (see `internal_key`), never `<prefix>__xtr_lock_time_probe__` as the Python peer does:
/// that key is also the lock key of a resource of that name, and the probe would overwrite a
/// lock held on it.
pub(super) const PROBE: &str = r#"
redis.call('TIME')
redis.call('SET', KEYS[1], '1', 'PX', 1)
return 1
"#;

pub(super) struct Scripts {
    pub(super) save: Lazy,
    pub(super) save_read: Lazy,
    pub(super) put_off: Lazy,
    pub(super) release_after: Lazy,
    pub(super) delete: Lazy,
    pub(super) wake: Lazy,
    pub(super) leave: Lazy,
    pub(super) revoke: Lazy,
    pub(super) exists: Lazy,
    pub(super) exists_legacy: Lazy,
    pub(super) probe: Lazy,
}

/// Each built on first use: all at once, they were 70 % of a Redis `run`'s instructions.
pub(super) static SCRIPTS: Scripts = Scripts {
    save: Lazy::new(|| script("", SAVE)),
    save_read: Lazy::new(|| script("", SAVE_READ)),
    put_off: Lazy::new(|| script("", PUT_OFF)),
    release_after: Lazy::new(|| script("", RELEASE_AFTER)),
    delete: Lazy::new(|| script("", DELETE)),
    wake: Lazy::new(|| script("", super::queue::WAKE)),
    leave: Lazy::new(|| script("", super::queue::LEAVE)),
    revoke: Lazy::new(|| script("", super::queue::REVOKE)),
    exists: Lazy::new(|| script("#!lua flags=no-writes\n", EXISTS_BODY)),
    exists_legacy: Lazy::new(|| script("", EXISTS_BODY)),
    probe: Lazy::new(|| redis::Script::new(PROBE)),
};

type Lazy = std::sync::LazyLock<redis::Script>;
fn script(flags: &str, body: &str) -> redis::Script {
    redis::Script::new(&format!("{flags}{}{body}", prelude_for(body)))
}

/// The helpers of [`PRELUDE`] and the queue's that `body` calls, directly or through other
/// helpers, in their order.
fn prelude_for(body: &str) -> String {
    super::prelude::prelude_from(&all_helpers(), body)
}

/// Every helper a lock's script may call: the shared ones, then the wait queue's.
pub(super) fn all_helpers() -> String {
    format!("{PRELUDE}{}", super::queue::QUEUE_PRELUDE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_script_carries_the_helpers_it_calls_and_no_other() {
        let save = prelude_for(SAVE);
        for helper in [
            "now_ms",
            "now_us",
            "zcall",
            "key_type",
            "scan",
            "announces",
            "refused",
            "queued_first",
            "ahead",
            "listeners",
            "wake_next",
        ] {
            assert!(
                save.contains(&format!("local function {helper}(")),
                "save lacks {helper}"
            );
        }
        assert!(!save.contains("local function extend("), "{save}");
        let delete = prelude_for(DELETE);
        for helper in ["wake_next", "wake", "expire_at_max", "now_ms"] {
            assert!(
                delete.contains(&format!("local function {helper}(")),
                "delete lacks {helper}"
            );
        }
        assert!(!delete.contains("local function scan("));
        assert!(prelude_for(EXISTS_BODY).contains("local function absent_code("));
        // Every helper a body calls is defined before the body.
        let release_after = prelude_for(RELEASE_AFTER);
        for helper in ["extend", "zcall", "absent_code", "expire_at_max", "wake"] {
            assert!(
                release_after.contains(&format!("local function {helper}(")),
                "release_after lacks {helper}"
            );
        }
        for body in [
            SAVE,
            SAVE_READ,
            PUT_OFF,
            RELEASE_AFTER,
            DELETE,
            super::super::queue::WAKE,
            super::super::queue::LEAVE,
            EXISTS_BODY,
        ] {
            let script = format!("{}{body}", prelude_for(body));
            for name in [
                "now_ms",
                "now_us",
                "zcall",
                "scan",
                "refused",
                "wake_next",
                "dequeue",
                "expire_at_max",
                "absent_code",
                "last_fence",
                "announces",
                "wake",
                "extend",
                "queued_first",
                "ahead",
                "listeners",
                "free_lock",
                "queue_recheck",
            ] {
                if body.contains(&format!("{name}(")) {
                    assert!(
                        script.contains(&format!("local function {name}(")),
                        "{name}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_scripts_know_the_tokens_that_announce_their_release() {
        assert!(super::PRELUDE.contains(&format!("'{}'", crate::key::ANNOUNCING_SUFFIX)));
    }
}
