-- Extend a lease, only for the holder of this very grant.
--
-- KEYS[1]  lock key      P:lock:{R}
-- ARGV[1]  owner id
-- ARGV[2]  token of the grant being extended
-- ARGV[3]  new lease in milliseconds (> 0), counted from now
--
-- Reply: 1 when extended.
-- Error: "NOTOWNED ..." when the lease expired or belongs to another grant.
if redis.call('GET', KEYS[1]) == ARGV[2] .. ':' .. ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return redis.error_reply('NOTOWNED lock ' .. KEYS[1] .. ' is not held by token ' .. ARGV[2])
