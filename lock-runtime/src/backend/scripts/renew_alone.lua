-- Put before the functions that tell who holds a lock, so that renewing a lock the
-- token holds alone costs a read and an expiry; holders that share the key go on to
-- the renewal below.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
