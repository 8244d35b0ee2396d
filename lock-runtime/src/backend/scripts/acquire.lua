-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] queue of waiting acquisitions
-- ARGV[1] the acquisition's token, ARGV[2] lease ms, ARGV[3] '1' to issue a fencing
-- token, ARGV[4] the queue: 'respect', 'join' to take or keep a place when the lock
-- is busy, or 'writers' (Redlock: waiting writers are kept, in no order, only to
-- hold off new shared holders, and nobody is passed the lock), ARGV[5] ms the place
-- is kept at least ('writers': 0 to take none), ARGV[6] claim window ms, ARGV[7]
-- grant channels' prefix, ARGV[8] publish command
-- Returns {1, token} when granted (token 0 without fencing); when the lock is held,
-- {0, ms, counter}: the longest a waiter must wait for a holder's lease to end, and
-- (with fencing) the last token issued, which Redlock needs to keep tokens
-- increasing; {2, held} when the lock is held as a kind this one never shares it
-- with (see `clash`).
local lock, fence, queue = KEYS[1], KEYS[2], KEYS[3]
local token, lease, fencing, mode = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4]
local kind = kind_of(token)

local function granted()
  if fencing then
    return {1, redis.call('INCR', fence)}
  end
  return {1, 0}
end

local held, holders_kind, count = state(lock)
if holds(lock, token, held, holders_kind) then
  -- Let in by a release: claim it for the whole lease.
  set_lease(lock, token, kind, lease)
  if mode ~= 'writers' then
    tell_first(queue, ARGV[7], ARGV[8], CLAIMED, token)
  end
  return granted()
end
local other = clash(kind, held, holders_kind)
if other then
  return {2, other}
end
local ordered = mode ~= 'writers'
if ordered and room(kind, held, holders_kind, count) then
  -- Freed by expiry, or room left, while others wait: the first of them go first.
  if admit_waiters(lock, queue, ARGV[6], ARGV[7], ARGV[8], token) then
    held, holders_kind, count = state(lock)
    if holds(lock, token, held, holders_kind) then
      set_lease(lock, token, kind, lease)
      return granted()
    end
    other = clash(kind, held, holders_kind)
    if other then
      return {2, other}
    end
  end
end
-- Behind the queue; where it keeps only writers, only a shared holder waits for them.
local behind = (ordered or kind == 'shared') and redis.call('ZCARD', queue) > 0
if room(kind, held, holders_kind, count) and not behind then
  grant(lock, queue, token, kind, lease)
  return granted()
end
if mode == 'join' or (mode == 'writers' and kind == 'exclusive' and ARGV[5] ~= '0') then
  -- Places go by arrival, in microseconds of the server's clock.
  local now = redis.call('TIME')
  redis.call('ZADD', queue, 'NX', now[1] .. string.format('%06d', now[2]), token)
  if redis.call('PTTL', queue) < tonumber(ARGV[5]) then
    redis.call('PEXPIRE', queue, ARGV[5])
  end
  if held == 'exclusive' then
    mark(lock)
  end
end
local wait = redis.call('PTTL', lock)
if held == 'counted' then
  -- The first holder's lease to end.
  local first = redis.call('ZRANGE', lock, 0, 0, 'WITHSCORES')
  wait = math.max(0, tonumber(first[2]) - now_ms())
end
local counter = 0
if fencing then
  counter = tonumber(redis.call('GET', fence) or 0)
end
return {0, wait, counter}
