-- KEYS[1] lock, KEYS[2] queue of waiting acquisitions
-- ARGV[1] the acquisition's token, ARGV[2] who hears of it: 'queue' (the first
-- waiter in the queue is passed the lock), 'broadcast' (every waiter hears a message
-- on ARGV[5]), or 'none', ARGV[3] claim window ms, ARGV[4] grant channels' prefix,
-- ARGV[5] release channel, ARGV[6] publish command
-- Returns 0 when the token did not hold the lock (nothing is changed: a waiter
-- giving up only leaves the queue), 1 when it freed the lock, 2 when it passed it
-- to the first waiter. `pcall`: a lock left by an older version is a hash, which is
-- never ours.
local lock, queue, token, waiters = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
if redis.pcall('GET', lock) ~= token then
  if waiters == 'queue' then
    redis.call('ZREM', queue, token)
  end
  return 0
end
-- Held under the token: it left the queue when it was granted.
if waiters == 'queue' and pass_to_first_waiter(lock, queue, ARGV[3], ARGV[4], ARGV[6]) then
  return 2
end
redis.call('DEL', lock)
if waiters == 'broadcast' then
  redis.call(ARGV[6], ARGV[5], '')
end
return 1
