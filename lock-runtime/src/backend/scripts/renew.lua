-- KEYS[1] lock; ARGV[1] the acquisition's token, ARGV[2] lease ms
-- Returns 1 when the token still holds the lock and its lease was reset, else 0.
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
