-- Schedule a failed delivery to run again after a delay (retry policy said yes).
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>
-- KEYS[2]  scheduled   P:{Q}:scheduled
-- KEYS[3]  stats       P:{Q}:stats                ("retried" or "fenced_out")
-- ARGV[1]  token of the delivery
-- ARGV[2]  delay in milliseconds
-- ARGV[3]  envelope of the next attempt (attempt + 1)
--
-- Reply: 1 when scheduled.
-- Error: "FENCED ..." when the token is no longer this consumer's delivery
--        (it was reaped or returned meanwhile); counted as fenced_out.
--!include _now_ms.lua
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  redis.call('HINCRBY', KEYS[3], 'fenced_out', 1)
  return redis.error_reply('FENCED delivery ' .. ARGV[1] .. ' is no longer current')
end
redis.call('ZADD', KEYS[2], now_ms() + tonumber(ARGV[2]), ARGV[3])
redis.call('HINCRBY', KEYS[3], 'retried', 1)
return 1
