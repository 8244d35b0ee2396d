-- KEYS[1] lock, KEYS[2] queue of waiting acquisitions
-- ARGV[1] the acquisition's token, ARGV[2] who hears of it: 'queue' (the waiters at
-- the head of the queue are let in), 'broadcast' (every waiter hears a message on
-- ARGV[5]), or 'none', ARGV[3] claim window ms, ARGV[4] grant channels' prefix,
-- ARGV[5] release channel, ARGV[6] publish command
-- Returns 0 when the token did not hold the lock (no holder is changed: a waiter
-- giving up only leaves the queue, letting in those behind it if the lock has room
-- for them, and the last to leave unmarks the holder), 1 when it let go, 2 when
-- that let waiters in.
local lock, queue, token, waiters = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local held, holder = state(lock)
if not holds(lock, token, held, holder) then
  local was_first = redis.call('ZRANGE', queue, 0, 0)[1] == token
  if redis.call('ZREM', queue, token) == 1 then
    if waiters == 'queue' then
      -- It may have been told to look again once a claim window has passed: the
      -- new first looks instead.
      if not admit_waiters(lock, queue, ARGV[3], ARGV[4], ARGV[6], nil) and was_first then
        tell_first(queue, ARGV[4], ARGV[6], LOOK_AGAIN, nil)
      end
    elseif waiters == 'broadcast' then
      -- A writer that stops waiting lets in the shared holders that waited for it.
      redis.call(ARGV[6], ARGV[5], '')
    end
    unmark_when_alone(lock, queue)
  end
  return 0
end
-- Held under the token: it left the queue when it was granted.
if held == 'exclusive' or redis.call('ZCARD', lock) == 1 then
  redis.call('DEL', lock)
else
  redis.call('ZREM', lock, token)
  expire_with_last(lock)
end
if waiters == 'queue' and admit_waiters(lock, queue, ARGV[3], ARGV[4], ARGV[6], nil) then
  return 2
end
if waiters == 'broadcast' then
  redis.call(ARGV[6], ARGV[5], '')
end
return 1
