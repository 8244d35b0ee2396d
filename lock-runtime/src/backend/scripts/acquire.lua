-- KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] queue of waiting acquisitions
-- ARGV[1] the acquisition's token, ARGV[2] lease ms, ARGV[3] '1' to issue a fencing
-- token, ARGV[4] the queue: 'off' (Redlock), 'respect', or 'join' to take or keep a
-- place when the lock is busy, ARGV[5] ms the place is kept at least, ARGV[6] claim
-- window ms, ARGV[7] grant channels' prefix, ARGV[8] publish command
-- Returns {1, token} when granted (token 0 without fencing), or, when the lock is
-- held, {0, pttl, counter}: the longest a waiter must wait, and (with fencing) the
-- last token issued, which Redlock needs to keep tokens increasing. A lock left by
-- an older version (a hash) is never ours, and is busy until its lease ends.
local lock, fence, queue = KEYS[1], KEYS[2], KEYS[3]
local token, lease, fencing, mode = ARGV[1], ARGV[2], ARGV[3] == '1', ARGV[4]

local function granted()
  if mode ~= 'off' then
    redis.call('ZREM', queue, token)
  end
  if fencing then
    return {1, redis.call('INCR', fence)}
  end
  return {1, 0}
end

local holder = redis.pcall('GET', lock)
if holder == token then
  -- Passed to this acquisition by a release: claim it for the whole lease.
  redis.call('PEXPIRE', lock, lease)
  return granted()
end
if holder == false then
  local first = nil
  if mode ~= 'off' then
    first = redis.call('ZRANGE', queue, 0, 0)[1]
  end
  if not first or first == token then
    redis.call('SET', lock, token, 'PX', lease)
    return granted()
  end
  -- Freed by expiry while others wait: the first of them goes first.
  pass_to_first_waiter(lock, queue, ARGV[6], ARGV[7], ARGV[8])
end
if mode == 'join' then
  -- Places go by arrival, in microseconds of the server's clock.
  local now = redis.call('TIME')
  redis.call('ZADD', queue, 'NX', now[1] .. string.format('%06d', now[2]), token)
  if redis.call('PTTL', queue) < tonumber(ARGV[5]) then
    redis.call('PEXPIRE', queue, ARGV[5])
  end
end
local counter = 0
if fencing then
  counter = tonumber(redis.call('GET', fence) or 0)
end
return {0, redis.call('PTTL', lock), counter}
