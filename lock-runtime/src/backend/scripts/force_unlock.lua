-- KEYS[1] lock, KEYS[2] queue of waiting acquisitions
-- ARGV[1] who hears of it: 'queue', 'broadcast' or 'none' (as for release.lua), ARGV[2] claim
-- window ms, ARGV[3] grant channels' prefix, ARGV[4] release channel, ARGV[5]
-- publish command
-- For operators: frees the lock whoever holds it, every holder of a shared lock or
-- semaphore and a lock left by an older version included, and tells the waiters as
-- a release does. Returns 1 when a lock was there, else 0.
local lock, queue, waiters = KEYS[1], KEYS[2], ARGV[1]
if state(lock) == 'free' then
  return 0
end
redis.call('DEL', lock)
if waiters == 'queue' then
  admit_waiters(lock, queue, ARGV[2], ARGV[3], ARGV[5], nil)
elseif waiters == 'broadcast' then
  redis.call(ARGV[5], ARGV[4], '')
end
return 1
