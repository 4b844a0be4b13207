-- Drop every dead letter of a queue (payloads, reasons and the index) at once.
-- Counters are unchanged: each letter was counted "failed" and "dead" when it
-- died, so the totals of invariant I6 still add up. Task records that a
-- letter left behind (state "dead") keep their own expiry.
--
-- KEYS[1]  dead        P:{Q}:dead
-- KEYS[2]  dead index  P:{Q}:dead:index
--
-- Reply: how many dead letters were dropped.
local n = redis.call('ZCARD', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
return n
