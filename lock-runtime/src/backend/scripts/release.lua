-- KEYS[1] lock, KEYS[2] release channel
-- ARGV[1] the acquisition's token, ARGV[2] publish command (PUBLISH, or SPUBLISH on
-- Cluster; empty for none)
-- Returns 0 when the token did not hold the lock (nothing is changed); else frees
-- it and returns 1 plus the number of connections the release reached, so that
-- the caller knows whether other clients wait. `pcall`: a lock left by an older
-- version is a hash, which is never ours.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  return 1 + redis.call(ARGV[2], KEYS[2], '')
end
return 1
