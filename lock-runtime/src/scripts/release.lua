-- KEYS[1] lock hash, KEYS[2] release channel
-- ARGV[1] owner, ARGV[2] publish command (PUBLISH, or SPUBLISH on Cluster; empty
-- for none)
-- Returns -1 when the owner does not hold the lock (nothing is changed),
-- the remaining hold count when it still does, 0 when the lock was freed.
local count = redis.call('HGET', KEYS[1], ARGV[1])
if not count then
  return -1
end
count = tonumber(count) - 1
if count > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], count)
  return count
end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  redis.call(ARGV[2], KEYS[2], '')
end
return 0
