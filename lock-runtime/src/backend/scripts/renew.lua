-- KEYS[1] lock; ARGV[1] the acquisition's token, ARGV[2] lease ms
-- Returns 1 when the token still holds the lock and its lease was reset, else 0.
local lock, token = KEYS[1], ARGV[1]
local held, holder = state(lock)
if not holds(lock, token, held, holder) then
  return 0
end
set_lease(lock, token, kind_of(token), ARGV[2])
return 1
