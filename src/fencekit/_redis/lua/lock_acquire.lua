-- Acquire a lease on a resource and issue its fencing token, atomically.
--
-- KEYS[1]  lock key      P:lock:{R}       value "<token>:<owner>", PX lease
-- KEYS[2]  token counter P:lock:{R}:seq   last token issued for R
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds (> 0)
--
-- Reply: the new token (integer), or nil when the lock is held.
-- The token is issued only when the lease is granted, so tokens grow by
-- grant, never by attempt. A reservation "0:<owner>" left by
-- idem_reclaim.lua counts as free for that owner only.
--!include _clock.lua
--!include _next_token.lua
local current = redis.call('GET', KEYS[1])
if current and current ~= '0:' .. ARGV[1] then
  return nil
end
local token = next_tokens(KEYS[2], 1)
redis.call('SET', KEYS[1], string.format('%d', token) .. ':' .. ARGV[1], 'PX', ARGV[2])
return token
