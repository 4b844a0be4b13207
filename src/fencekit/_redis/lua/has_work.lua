-- Which of a consumer's queues it found empty have work again: a consumer busy
-- with its other queues asks in its turn, so a queue filled meanwhile takes its
-- turn in the rotation (round-robin, docs/guides/flow.md) instead of waiting until
-- every other queue is empty. Read only.
--
-- KEYS[1..n]  pending  P:{Q}:pending of each queue (its priority lists hang off
--                      it: P:{Q}:pending:prio marks them, lua/_prio.lua)
-- ARGV        none
--
-- Reply: the 1-based indexes of the KEYS whose queue has a task waiting
local found = {}
for i, pending in ipairs(KEYS) do
  if redis.call('LLEN', pending) > 0 or redis.call('EXISTS', pending .. ':prio') == 1 then
    found[#found + 1] = i
  end
end
return found
