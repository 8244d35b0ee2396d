-- KEYS[1] fencing counter; ARGV[1] floor
-- Raises the counter to the floor if it is below, so the next token exceeds it.
-- Returns the counter.
local current = tonumber(redis.call('GET', KEYS[1]) or 0)
local floor = tonumber(ARGV[1])
if current < floor then
  redis.call('SET', KEYS[1], floor)
  return floor
end
return current
