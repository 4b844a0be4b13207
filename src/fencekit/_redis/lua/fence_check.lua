-- Diagnostic fence check: is this token still at least the newest seen?
-- A separate write after a check races (check-then-act); write with
-- fence_set.lua instead.
--
-- KEYS[1]  fence key     P:fence:{R}      highest token accepted for R
-- ARGV[1]  token
--
-- Reply: the current highest token (0 when none) when ARGV[1] >= it.
-- Error: "FENCED ..." when a newer token was accepted already.
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < max then
  return redis.error_reply('FENCED token ' .. ARGV[1] .. ' is older than ' .. string.format('%d', max))
end
return max
