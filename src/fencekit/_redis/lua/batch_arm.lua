-- Arm an open batch: from now on its callbacks fire once every child is
-- final -- at once, when they all are already.
--
-- KEYS[1]  meta      P:{b:<bid>}:batch
--
-- Reply: the callbacks (JSON) when this call completed the batch (its state is
--        then "completing"), else "" (armed, children still running; or armed
--        before).
-- Error: "NOBATCH ..." when the batch does not exist.
--!include _batch.lua
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return redis.error_reply('NOBATCH ' .. KEYS[1] .. ' does not exist')
end
if state ~= 'open' then
  return ''
end
redis.call('HSET', KEYS[1], 'state', 'armed')
return complete_if_due(KEYS[1])
