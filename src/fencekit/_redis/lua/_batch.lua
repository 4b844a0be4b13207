-- Include-only helpers of a batch's bookkeeping (P:{b:<bid>}:batch, a HASH;
-- docs/design/batches.md).
--
-- complete_if_due: once the batch is armed and every child is final, move it
-- to "completing" and return its callbacks (JSON) -- in the one call that
-- makes the move, so they are handed out once; "" otherwise.
local function complete_if_due(meta)
  local state, total, final = unpack(redis.call('HMGET', meta, 'state', 'total', 'final'))
  if state ~= 'armed' or tonumber(final) < tonumber(total) then
    return ''
  end
  redis.call('HSET', meta, 'state', 'completing')
  return redis.call('HGET', meta, 'callbacks') or '{}'
end
