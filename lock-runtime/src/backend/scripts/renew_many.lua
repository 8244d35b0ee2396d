-- KEYS the locks; ARGV for the lock KEYS[i], the token that should hold it,
-- ARGV[2i-1], and the lease ms to give it, ARGV[2i]
-- Returns, for each lock, 1 when its token still held it and its lease was reset,
-- else 0: the renewals that fell due together, in one call.
-- One MGET reads them all: a call from Lua costs Redis about as much as the command
-- it runs, and most of these locks are plain strings (a lock of another type reads
-- as nil there, and goes the long way).
local values = redis.call('MGET', unpack(KEYS))
local renewed = {}
for i, lock in ipairs(KEYS) do
  local token, lease = ARGV[2 * i - 1], ARGV[2 * i]
  renewed[i] = 0
  if values[i] == token then
    redis.call('PEXPIRE', lock, lease)
    renewed[i] = 1
  else
    local held, holder = state(lock)
    if holds(lock, token, held, holder) then
      set_lease(lock, token, kind_of(token), lease)
      renewed[i] = 1
    end
  end
end
return renewed
