-- Who holds a lock, and the queue of acquisitions waiting for it. Prefixed to every
-- script that reads or changes a lock.
--
-- An exclusive holder keeps the lock key as a string: its token, with the lease as the
-- key's expiry. Holders that share the key (shared holders, or a semaphore's) keep it
-- as a sorted set of their tokens, each scored by when its lease ends on the server's
-- clock; the key expires with the last of them. A token says what it asks for:
-- `<client>:<number>` the lock alone, `<client>:<number>:shared`, or
-- `<client>:<number>:permits=<n>`. A lock left by an older version (a hash) is busy
-- until it expires.
--
-- While acquisitions wait in the queue, an exclusive holder's token is kept marked
-- (`MARKED` after it). So a lock whose value is its holder's token alone has nobody
-- to let in, and its holder frees it with a plain compare-and-delete
-- (`release_alone.lua`, or `DELIFEQ` or `DELEX` where the server has one). The last
-- waiter to leave takes the mark off; one left when the queue expired only sends
-- that release the long way.

local MARKED = '|queued'

local clock = nil
local function now_ms()
  if not clock then
    local time = redis.call('TIME')
    clock = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  return clock
end

-- 'exclusive', 'shared', or a semaphore's number of permits.
local function kind_of(token)
  if string.sub(token, -7) == ':shared' then
    return 'shared'
  end
  local permits = string.match(token, ':permits=(%d+)$')
  if permits then
    return tonumber(permits)
  end
  return 'exclusive'
end

local function is_marked(value)
  return string.sub(value, -#MARKED) == MARKED
end

-- An exclusive holder's token, from the lock's value.
local function holder_of(value)
  if is_marked(value) then
    return string.sub(value, 1, -#MARKED - 1)
  end
  return value
end

-- The lock as it stands: 'free'; 'exclusive' and the holder's token; 'counted', the
-- holders' kind and their number (expired holders dropped); or 'legacy'.
local function state(lock)
  -- A lock is most often a string: one read tells, and only another type costs two.
  local holder = redis.pcall('GET', lock)
  if holder == false then
    return 'free'
  elseif type(holder) == 'string' then
    return 'exclusive', holder_of(holder)
  elseif redis.call('TYPE', lock)['ok'] == 'zset' then
    redis.call('ZREMRANGEBYSCORE', lock, '-inf', now_ms())
    local first = redis.call('ZRANGE', lock, 0, 0)[1]
    if not first then
      redis.call('DEL', lock)
      return 'free'
    end
    return 'counted', kind_of(first), redis.call('ZCARD', lock)
  end
  return 'legacy'
end

local function holds(lock, token, held, holder)
  if held == 'exclusive' then
    return holder == token
  end
  return held == 'counted' and redis.call('ZSCORE', lock, token) ~= false
end

-- Whether a holder of `kind` may join the lock's holders now.
local function room(kind, held, holders_kind, count)
  if held == 'free' then
    return true
  end
  if held ~= 'counted' or kind ~= holders_kind then
    return false
  end
  return kind == 'shared' or count < kind
end

-- How the lock is held when `kind` can never share it, as a number: 0 a lock (or
-- its exclusive side), -1 shared, n a semaphore of n permits; else nil. Locks and
-- shared holders are one read-write lock; a semaphore mixes with neither, nor with a
-- semaphore of another size.
local function clash(kind, held, holders_kind)
  if held == 'exclusive' and type(kind) == 'number' then
    return 0
  end
  if held ~= 'counted' or holders_kind == kind then
    return nil
  end
  if type(kind) == 'number' or type(holders_kind) == 'number' then
    if holders_kind == 'shared' then
      return -1
    end
    return holders_kind
  end
  return nil
end

-- Holders that share the key keep it as long as the last lease left on it, shorter
-- ones included, so that its PTTL tells the truth.
local function expire_with_last(lock)
  local last = redis.call('ZRANGE', lock, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', lock, math.max(1, tonumber(last[2]) - now_ms()))
end

-- Sets the lease of `token` to end `lease` ms from now: an exclusive holder's by
-- the key's expiry, its mark kept; a holder that shares the key by its score, which
-- adds it if it was not one.
local function set_lease(lock, token, kind, lease)
  if kind == 'exclusive' then
    redis.call('PEXPIRE', lock, lease)
    return
  end
  redis.call('ZADD', lock, now_ms() + lease, token)
  expire_with_last(lock)
end

-- Marks the exclusive holder's token: an acquisition waits for it.
local function mark(lock)
  local value = redis.call('GET', lock)
  if not is_marked(value) then
    redis.call('SET', lock, value .. MARKED, 'KEEPTTL')
  end
end

-- Takes the mark off the exclusive holder's token once nobody waits for it.
local function unmark_when_alone(lock, queue)
  if redis.call('EXISTS', queue) == 1 then
    return
  end
  local value = redis.pcall('GET', lock)
  if type(value) == 'string' and is_marked(value) then
    redis.call('SET', lock, holder_of(value), 'KEEPTTL')
  end
end

-- Lets `token` in for `lease` ms, out of the queue: an exclusive holder marked
-- while others wait.
local function grant(lock, queue, token, kind, lease)
  redis.call('ZREM', queue, token)
  if kind ~= 'exclusive' then
    set_lease(lock, token, kind, lease)
  elseif redis.call('ZCARD', queue) > 0 then
    redis.call('SET', lock, token .. MARKED, 'PX', lease)
  else
    redis.call('SET', lock, token, 'PX', lease)
  end
end

-- Besides a grant (the token let in), a waiting client hears on its grant channel:
-- LOOK_AGAIN, when those let in ahead of it have the claim window to claim the lock
-- and nothing would run here should they not, so it looks again once the window has
-- passed; and CLAIMED, when one of them did, so it need not. backend/signals.rs
-- reads the same words.
local LOOK_AGAIN, CLAIMED = 'look-again', 'claimed'

-- Tells the client of the first acquisition in the queue, unless that is `asking`,
-- which learns from its own reply.
local function tell_first(queue, grants, publish, message, asking)
  local first = redis.call('ZRANGE', queue, 0, 0)[1]
  if first and first ~= asking then
    redis.call(publish, grants .. string.match(first, '^[^:]*'), message)
  end
end

-- Lets the acquisitions at the head of the queue in while the lock has room for
-- them, each for a short claim window, and tells each on its client's grant channel
-- (all but `asking`, which learns from its own reply). Returns whether any got in.
local function admit_waiters(lock, queue, claim_ms, grants, publish, asking)
  local admitted = false
  while true do
    local first = redis.call('ZRANGE', queue, 0, 0)[1]
    if not first then
      return admitted
    end
    local kind = kind_of(first)
    local held, holders_kind, count = state(lock)
    if not room(kind, held, holders_kind, count) then
      if admitted then
        tell_first(queue, grants, publish, LOOK_AGAIN, asking)
      end
      return admitted
    end
    grant(lock, queue, first, kind, claim_ms)
    if first ~= asking then
      redis.call(publish, grants .. string.match(first, '^[^:]*'), first)
    end
    admitted = true
  end
end
