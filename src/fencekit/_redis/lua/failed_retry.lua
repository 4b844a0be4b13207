-- Run a failed task again: take its record out of the failed index and
-- enqueue it afresh (attempt 0); the record is pending again, or deleted when
-- the new attempt keeps none.
--
-- KEYS[1]  failed      P:{Q}:failed       LIST record keys, newest first
-- KEYS[2]  record      P:{Q}:job:<jid>
-- KEYS[3]  pending     P:{Q}:pending
-- KEYS[4]  stats       P:{Q}:stats        ("enqueued" and "revived" += 1)
-- KEYS[5]  wake        P:{Q}:wake
-- ARGV[1]  envelope to enqueue
-- ARGV[2]  retention of the new attempt's record in ms, 0: no record
--
-- Reply: 1 when enqueued, 0 when the task is not (or no longer) a kept failure.
--!include _wake.lua
--!include _prio.lua
--!include _now_ms.lua
--!include _env.lua
if redis.call('LREM', KEYS[1], 0, KEYS[2]) == 0 then
  return 0
end
push_pending(KEYS[3], ARGV[1], false)
wake(KEYS[5])
redis.call('HINCRBY', KEYS[4], 'enqueued', 1)
redis.call('HINCRBY', KEYS[4], 'revived', 1)
redis.call('DEL', KEYS[2])
if ARGV[2] ~= '0' then
  write_env(KEYS[2], ARGV[1], { 'state', 'pending', 'enqueued', now_ms(), 'keep', ARGV[2] })
end
return 1
