-- KEYS[1] lock, KEYS[2] release channel
-- ARGV[1] the acquisition's token, ARGV[2] publish command (PUBLISH, or SPUBLISH on
-- Cluster; empty for none)
-- Returns 1 when the token held the lock and freed it, 0 when it did not hold it
-- (nothing is changed). `pcall`: a lock left by an older version is a hash, which
-- is never ours.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  redis.call(ARGV[2], KEYS[2], '')
end
return 1
