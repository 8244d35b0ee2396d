-- KEYS[1] lock hash; ARGV[1] owner, ARGV[2] lease ms
-- Returns 1 when the owner still holds the lock and its lease was reset, else 0.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
