-- Register consumers and record that they are alive now (server clock).
-- A consumer re-registers with every beat, so one forgotten while Redis was
-- unreachable is watched again as soon as it is back in touch.
--
-- KEYS[1]  consumers   P:{registry}:consumers   HASH id -> JSON info
-- KEYS[2]  beats       P:{registry}:beats       ZSET id -> last beat ms
-- ARGV     pairs: consumer id, info JSON (one pair per consumer)
--
-- Reply: the server time in milliseconds.
--!include _now_ms.lua
local now = now_ms()
for i = 1, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[2], now, ARGV[i])
end
return now
