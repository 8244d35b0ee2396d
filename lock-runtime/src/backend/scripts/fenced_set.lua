-- KEYS[1] a hash {value, fence}; ARGV[1] value, ARGV[2] fencing token
-- Writes unless a later token already wrote; returns 1 when written, 0 when refused.
local stored = tonumber(redis.call('HGET', KEYS[1], 'fence') or 0)
if tonumber(ARGV[2]) < stored then
  return 0
end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'fence', ARGV[2])
return 1
