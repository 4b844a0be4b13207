-- Include-only helpers of a batch's bookkeeping (P:{b:<bid>}:batch, a HASH;
-- docs/design/batches.md).
--
-- add_queues: merge a space-separated list of queue names into the batch's
-- "queues" field (where its children live: cancel and results read them).
-- complete_if_due: once the batch is armed and every child is final, move it
-- to "completing" and return its callbacks (JSON) -- in the one call that
-- makes the move, so they are handed out once; "" otherwise.
local function add_queues(meta, names)
  local known = {}
  local order = {}
  for name in string.gmatch((redis.call('HGET', meta, 'queues') or '') .. ' ' .. names, '%S+') do
    if not known[name] then
      known[name] = true
      order[#order + 1] = name
    end
  end
  redis.call('HSET', meta, 'queues', table.concat(order, ' '))
end

local function complete_if_due(meta)
  local state, total, final = unpack(redis.call('HMGET', meta, 'state', 'total', 'final'))
  if state ~= 'armed' or tonumber(final) < tonumber(total) then
    return ''
  end
  redis.call('HSET', meta, 'state', 'completing')
  return redis.call('HGET', meta, 'callbacks') or '{}'
end
