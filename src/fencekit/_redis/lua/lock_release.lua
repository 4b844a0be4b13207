-- Release a lease, only for the holder of this very grant.
--
-- KEYS[1]  lock key      P:lock:{R}
-- ARGV[1]  owner id
-- ARGV[2]  token of the grant being released
--
-- Reply: 1 when released.
-- Error: "NOTOWNED ..." when the lease expired or belongs to another grant.
if redis.call('GET', KEYS[1]) == ARGV[2] .. ':' .. ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return redis.error_reply('NOTOWNED lock ' .. KEYS[1] .. ' is not held by token ' .. ARGV[2])
