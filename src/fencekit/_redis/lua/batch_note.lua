-- Count children that became final, each exactly once, and hand out the
-- batch's callbacks exactly once. A note is what the script that settled a
-- child's current delivery recorded in the child's own slot; it is applied
-- here, in the batch's slot, any number of times (a crash between applying a
-- note and dropping it applies it again): a child already final, or unknown
-- to the batch, counts nothing.
--
-- KEYS[1]  meta      P:{b:<bid>}:batch
-- KEYS[2]  children  P:{b:<bid>}:children
-- ARGV[1..] pairs: the child's jid, its outcome (s succeeded, f failed for
--          good, c cancelled)
--
-- Reply: { counted, ignored, fire }
--   counted  notes that made a child final
--   ignored  notes about a child final already, or not of this batch
--   fire     the callbacks (JSON) when this call completed the batch (its state
--            is then "completing"), else ""
-- Error: "BADNOTE ..." for an odd number of arguments or an outcome other than
--        s, f, c (nothing counted).
--!include _batch.lua
local field = { s = 'succeeded', f = 'failed', c = 'cancelled' }
if #ARGV % 2 == 1 then
  return redis.error_reply('BADNOTE a note is a jid and an outcome: ' .. #ARGV .. ' arguments')
end
for i = 2, #ARGV, 2 do
  if not field[ARGV[i]] then
    return redis.error_reply('BADNOTE outcome ' .. ARGV[i] .. ' is not s, f or c')
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return { 0, math.floor(#ARGV / 2), '' }
end
local counted, ignored = 0, 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == '' then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    redis.call('HINCRBY', KEYS[1], field[ARGV[i + 1]], 1)
    counted = counted + 1
  else
    ignored = ignored + 1
  end
end
if counted > 0 then
  redis.call('HINCRBY', KEYS[1], 'final', counted)
end
return { counted, ignored, complete_if_due(KEYS[1]) }
