-- KEYS the locks; ARGV the tokens that should hold them, in the same order
-- Returns, for each lock, 1 when its token holds it, else 0. When any does, that
-- lock's expiry is written again as it stands: a change of nothing that still goes
-- to the replicas, so that a `WAIT` sent after this on the same connection waits
-- until they have everything this node had of these locks.
local held = {}
local written = false
for i, lock in ipairs(KEYS) do
  local state_of, holder = state(lock)
  held[i] = 0
  if holds(lock, ARGV[i], state_of, holder) then
    held[i] = 1
    local expires = redis.call('PEXPIRETIME', lock)
    if not written and expires > 0 then
      redis.call('PEXPIREAT', lock, expires)
      written = true
    end
  end
end
return held
