-- Forget a consumer: only if its beat is still missing at this moment (the
-- reaper, after returning its tasks), or unconditionally (a clean shutdown).
--
-- KEYS[1]  consumers   P:{registry}:consumers
-- KEYS[2]  beats       P:{registry}:beats
-- ARGV[1]  consumer id
-- ARGV[2]  heartbeat TTL in milliseconds; 0 to forget unconditionally
--
-- Reply: 1 when forgotten, 0 when its beat is back (it is alive: keep it).
--!include _now_ms.lua
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  local beat = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if beat and tonumber(beat) >= now_ms() - ttl then
    return 0
  end
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
