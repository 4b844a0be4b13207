-- Re-enqueue a dead letter as it was stored (after its worker was fixed or
-- registered), removing it from the dead-letter record.
--
-- KEYS[1]  dead        P:{Q}:dead
-- KEYS[2]  dead index  P:{Q}:dead:index
-- KEYS[3]  pending     P:{Q}:pending
-- KEYS[4]  stats       P:{Q}:stats       ("enqueued" and "revived" += 1)
-- KEYS[5]  wake        P:{Q}:wake
-- KEYS[6]  record      P:{Q}:job:<jid>   (optional) pending again if it exists
-- ARGV[1]  dead-letter id
-- ARGV[2]  envelope to enqueue instead of the stored raw payload, "" for the raw one
--
-- Reply: 1 when re-enqueued, 0 when no such dead letter.
--!include _wake.lua
--!include _prio.lua
--!include _env.lua
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return 0
end
if ARGV[2] ~= '' then
  raw = ARGV[2]
end
redis.call('HDEL', KEYS[1], ARGV[1], ARGV[1] .. ':why')
redis.call('ZREM', KEYS[2], ARGV[1])
push_pending(KEYS[3], raw, false)
redis.call('HINCRBY', KEYS[4], 'enqueued', 1)
redis.call('HINCRBY', KEYS[4], 'revived', 1)
wake(KEYS[5])
if KEYS[6] and redis.call('EXISTS', KEYS[6]) == 1 then
  redis.call('HDEL', KEYS[6], 'error', 'finished', 'token', 'result', 'progress')
  write_env(KEYS[6], raw, { 'state', 'pending' })
  redis.call('PERSIST', KEYS[6])
end
return 1
