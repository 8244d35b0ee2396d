-- The queue of acquisitions waiting for a lock, one per waiting client, oldest
-- first. A lock that would be free goes to the first of them instead: it holds the
-- lock under its token for a short claim window, and is told on its client's grant
-- channel. Prefixed to the scripts that can free a lock.
local function pass_to_first_waiter(lock, queue, claim_ms, grants, publish)
  local first = redis.call('ZRANGE', queue, 0, 0)[1]
  if not first then
    return false
  end
  redis.call('ZREM', queue, first)
  redis.call('SET', lock, first, 'PX', claim_ms)
  -- A token is `<client>:<number>`; each client listens on its own channel.
  redis.call(publish, grants .. string.match(first, '^[^:]*'), first)
  return true
end
