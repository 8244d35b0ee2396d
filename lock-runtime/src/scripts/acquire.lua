-- KEYS[1] lock hash {owner -> hold count}, KEYS[2] fencing counter
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] '1' to issue a fencing token
-- Returns {1, token} when granted (token 0 without fencing),
-- or {0, pttl} when another owner holds it: the longest a waiter must wait.
local held = redis.call('EXISTS', KEYS[1]) == 1
if held and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[3] ~= '1' then
  return {1, 0}
end
if held then
  return {1, tonumber(redis.call('GET', KEYS[2]) or 0)}
end
return {1, redis.call('INCR', KEYS[2])}
