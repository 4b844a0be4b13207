-- Fenced write: check the token, advance the fence and SET the target, in
-- one atomic step. Equal tokens pass, so one grant may write many times.
--
-- KEYS[1]  fence key     P:fence:{R}
-- KEYS[2]  target key    the caller's key (on Cluster it must share R's hash tag)
-- ARGV[1]  token
-- ARGV[2]  value to SET at the target
-- ARGV[3]  expiry of the fence key in milliseconds, 0 for none
--
-- Reply: 1 when written.
-- Error: "FENCED ..." when a newer token was accepted already; nothing changes.
local max = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < max then
  return redis.error_reply('FENCED token ' .. ARGV[1] .. ' is older than ' .. string.format('%d', max))
end
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
