-- Put before the functions that tell who holds a lock, so that the everyday release
-- costs what a plain compare-and-delete does: a lock the token holds alone, with
-- nobody queued for it and no waiter to tell, is deleted at once. Everything else
-- (shared holders, a queue, a broadcast) goes on to the release below.
if ARGV[2] ~= 'broadcast' and redis.pcall('GET', KEYS[1]) == ARGV[1]
    and (ARGV[2] == 'none' or redis.call('ZCARD', KEYS[2]) == 0) then
  redis.call('DEL', KEYS[1])
  return 1
end
