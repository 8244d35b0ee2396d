-- KEYS[1] lock; ARGV[1] the acquisition's token
-- The everyday release, as cheap as a plain compare-and-delete: deletes the lock
-- when its value is the token alone, which holds it with nobody queued for it (see
-- `MARKED` in holders.lua). Returns 1 when deleted, else 0: the lock is held
-- otherwise (marked, shared, by another), and release.lua tells what to do.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
