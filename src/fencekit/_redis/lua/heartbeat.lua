-- Register consumers and record that they are alive now (server clock), and
-- read the store id: a random id the first beat ever writes and no script
-- deletes, so a beat that finds it missing or changed tells its caller that
-- Redis lost its data (restarted empty, flushed) since the previous beat.
-- A consumer re-registers with every beat, so one forgotten while Redis was
-- unreachable is watched again as soon as it is back in touch.
--
-- KEYS[1]  consumers   P:{registry}:consumers   HASH id -> JSON info
-- KEYS[2]  beats       P:{registry}:beats       ZSET id -> last beat ms
-- KEYS[3]  store id    P:{registry}:store       STRING random id of this data set
-- ARGV[1]  the id to write when there is none
-- ARGV[2..] pairs: consumer id, info JSON (one pair per consumer; none is fine)
--
-- Reply: { server time in milliseconds, the store id now }
--!include _now_ms.lua
local now = now_ms()
local store = redis.call('GET', KEYS[3])
if not store then
  store = ARGV[1]
  redis.call('SET', KEYS[3], store)
end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[2], now, ARGV[i])
end
return { now, store }
