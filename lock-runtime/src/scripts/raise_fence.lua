-- KEYS[1] fencing counter; ARGV[1] floor
-- Raises the counter to the floor if it is below, so the next token exceeds it.
local current = tonumber(redis.call('GET', KEYS[1]) or 0)
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
