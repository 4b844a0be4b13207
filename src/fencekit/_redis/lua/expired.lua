-- List consumers whose heartbeat is older than the TTL (server clock).
--
-- KEYS[1]  beats       P:{registry}:beats
-- ARGV[1]  heartbeat TTL in milliseconds
-- ARGV[2]  the most ids to return
--
-- Reply: array of consumer ids, oldest beat first.
--!include _now_ms.lua
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now_ms() - tonumber(ARGV[1])),
  'LIMIT', 0, tonumber(ARGV[2]))
