-- KEYS[1] lock, KEYS[2] fencing counter
-- ARGV[1] the acquisition's token, ARGV[2] lease ms, ARGV[3] '1' to issue a fencing token
-- Returns {1, token} when granted (token 0 without fencing), or, when the lock is
-- held, {0, pttl, counter}: the longest a waiter must wait, and (with fencing) the
-- last token issued, which Redlock needs to keep tokens increasing. A lock left by
-- an older version (a hash) exists too, so `SET NX` respects it until its lease ends.
local fencing = ARGV[3] == '1'
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if fencing then
    return {1, redis.call('INCR', KEYS[2])}
  end
  return {1, 0}
end
local counter = 0
if fencing then
  counter = tonumber(redis.call('GET', KEYS[2]) or 0)
end
return {0, redis.call('PTTL', KEYS[1]), counter}
