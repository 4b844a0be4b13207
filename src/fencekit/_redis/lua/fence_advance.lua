-- Accept a token and record it as the newest, atomically.
-- Equal tokens pass, so one grant may write many times.
--
-- KEYS[1]  fence key     P:fence:{R}
-- ARGV[1]  token
-- ARGV[2]  expiry of the fence key in milliseconds, 0 for none
--
-- Reply: 1 when accepted (the fence key now holds max(old, token)).
-- Error: "FENCED ..." when a newer token was accepted already; nothing changes.
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < max then
  return redis.error_reply('FENCED token ' .. ARGV[1] .. ' is older than ' .. string.format('%d', max))
end
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
