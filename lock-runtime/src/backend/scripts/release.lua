-- KEYS[1] lock, KEYS[2] queue of waiting acquisitions
-- ARGV[1] the acquisition's token, ARGV[2] who hears of it: 'queue' (the waiters at
-- the head of the queue are let in), 'broadcast' (every waiter hears a message on
-- ARGV[5]), or 'none', ARGV[3] claim window ms, ARGV[4] grant channels' prefix,
-- ARGV[5] release channel, ARGV[6] publish command
-- Returns 0 when the token did not hold the lock (nothing is changed: a waiter
-- giving up only leaves the queue), 1 when it let go, 2 when that let waiters in.
local lock, queue, token, waiters = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local held, holder = state(lock)
if not holds(lock, token, held, holder) then
  redis.call('ZREM', queue, token)
  return 0
end
-- Held under the token: it left the queue when it was granted.
if held == 'exclusive' or redis.call('ZCARD', lock) == 1 then
  redis.call('DEL', lock)
else
  redis.call('ZREM', lock, token)
  -- The key lives as long as the last lease left, so that its PTTL tells the truth.
  local last = redis.call('ZRANGE', lock, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', lock, math.max(1, tonumber(last[2]) - now_ms()))
end
if waiters == 'queue' and admit_waiters(lock, queue, ARGV[3], ARGV[4], ARGV[6], nil) then
  return 2
end
if waiters == 'broadcast' then
  redis.call(ARGV[6], ARGV[5], '')
end
return 1
