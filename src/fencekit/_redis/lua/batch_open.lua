-- Open a batch: its bookkeeping in a slot of its own, its children registered
-- as not final yet. Children are registered before they are enqueued, so a
-- note about a child never arrives before the child is known.
--
-- KEYS[1]  meta      P:{b:<bid>}:batch
-- KEYS[2]  children  P:{b:<bid>}:children  jid -> "" (not final) | outcome
-- ARGV[1]  callbacks: JSON object of envelopes by kind (complete, success,
--          failure), only those set; "{}" for none
-- ARGV[2]  1: armed (the callbacks fire once every child is final); 0: open
--          (children may still be added; batch_arm.lua arms it)
-- ARGV[3]  the parent batch's id, "" for none
-- ARGV[4]  the children's queues, space-separated
-- ARGV[5]  keep_ms: how long the batch stays readable once done (> 0)
-- ARGV[6..] the children's jids
--
-- Reply: the number of distinct children registered.
-- Error: "BATCHEXISTS <bid>" when the batch exists already.
--!include _now_ms.lua
--!include _batch.lua
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('BATCHEXISTS ' .. KEYS[1] .. ' exists already')
end
local added = 0
for i = 6, #ARGV do
  added = added + redis.call('HSETNX', KEYS[2], ARGV[i], '')
end
local state = 'open'
if ARGV[2] == '1' then
  state = 'armed'
end
redis.call('HSET', KEYS[1], 'state', state, 'total', added, 'final', 0, 'succeeded', 0,
  'failed', 0, 'cancelled', 0, 'created', now_ms(),
  'callbacks', ARGV[1], 'parent', ARGV[3], 'keep', ARGV[5])
add_queues(KEYS[1], ARGV[4])
return added
