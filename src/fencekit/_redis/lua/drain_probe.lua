-- What is left of one queue, read at one instant: the burst-mode rule
-- (fencekit.services.drain) calls it per queue, twice in a row, to decide
-- "drained". Read-only; every key shares the queue's hash tag.
--
-- KEYS[1]  pending     P:{Q}:pending     LIST
-- KEYS[2]  scheduled   P:{Q}:scheduled   ZSET scored by due time (ms)
-- KEYS[3]  stats       P:{Q}:stats       HASH counters
-- KEYS[4..] inflight   P:{Q}:inflight:<consumer> of every registered consumer
--
-- Reply: { pending, scheduled, inflight, next_due_ms, stats }
--   pending      the tasks on the pending lists (every priority)
--   scheduled    ZCARD of the set
--   inflight     the summed HLEN of the in-flight hashes
--   next_due_ms  the earliest scheduled task's due time (ms, as text), "" when none
--   stats        the counters as HGETALL returns them
--!include _prio.lua
local scheduled = redis.call('ZCARD', KEYS[2])
local next_due = ''
if scheduled > 0 then
  next_due = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]
end
local inflight = 0
for i = 4, #KEYS do
  inflight = inflight + redis.call('HLEN', KEYS[i])
end
return { pending_len(KEYS[1]), scheduled, inflight, next_due, redis.call('HGETALL', KEYS[3]) }
