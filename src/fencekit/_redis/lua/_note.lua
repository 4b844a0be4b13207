-- Include-only helpers of a batch child's settle (docs/design/batches.md).
--
-- batch_of: the batch id an envelope carries ("batch", placed by the codec
-- right after the jid and any "priority" and "ckey", so one anchored walk
-- reads it and a "batch" inside params never matches), or nil.
-- note_final: in the script that makes a child final, push the note
-- "<bid> <jid> <outcome>" onto its queue's notes list P:{Q}:notes (derived
-- from the queue's stats key P:{Q}:stats: same slot). Outcomes: s succeeded,
-- f failed for good, c cancelled or expired. An envelope of no batch: nothing.
local function batch_of(envelope)
  local _, at = string.find(envelope, '^{"jid":"[^"]*",')
  if not at then
    return nil
  end
  local _, e = string.find(envelope, '^"priority":%-?%d+,', at + 1)
  if e then
    at = e
  end
  _, e = string.find(envelope, '^"ckey":"[^"]*",', at + 1)
  if e then
    at = e
  end
  return string.match(envelope, '^"batch":"([^"]*)"', at + 1)
end

local function note_final(stats, envelope, outcome)
  local bid = batch_of(envelope)
  if bid then
    local jid = string.match(envelope, '^{"jid":"([^"]*)"')
    redis.call('LPUSH', string.sub(stats, 1, -6) .. 'notes', bid .. ' ' .. jid .. ' ' .. outcome)
  end
end
