-- KEYS[1] lock hash {owner -> hold count}, KEYS[2] fencing counter
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] '1' to issue a fencing token
-- Returns {1, token} when granted (token 0 without fencing), or, when another
-- owner holds it, {0, pttl, counter}: the longest a waiter must wait, and (with
-- fencing) the last token issued, which Redlock needs to keep tokens increasing.
local fencing = ARGV[3] == '1'
local held = redis.call('EXISTS', KEYS[1]) == 1
if held and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  local counter = 0
  if fencing then
    counter = tonumber(redis.call('GET', KEYS[2]) or 0)
  end
  return {0, redis.call('PTTL', KEYS[1]), counter}
end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if not fencing then
  return {1, 0}
end
if held then
  return {1, tonumber(redis.call('GET', KEYS[2]) or 0)}
end
return {1, redis.call('INCR', KEYS[2])}
