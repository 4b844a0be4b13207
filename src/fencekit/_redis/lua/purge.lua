-- Drop every task waiting in a queue (not scheduled, not in flight).
--
-- KEYS[1]  pending     P:{Q}:pending
-- KEYS[2]  stats       P:{Q}:stats       ("purged" += n, so counters still add up)
--
-- Reply: the number of tasks dropped.
local n = redis.call('LLEN', KEYS[1])
if n > 0 then
  redis.call('DEL', KEYS[1])
  redis.call('HINCRBY', KEYS[2], 'purged', n)
end
return n
