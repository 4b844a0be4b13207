-- Re-enqueue a batch of dead letters as they were stored (revive-all): each
-- as dead_revive.lua does it, the counters bumped once for the batch. A
-- letter gone meanwhile (revived or purged by someone else, or dropped past
-- keep_dead) is skipped.
--
-- KEYS[1]  dead        P:{Q}:dead
-- KEYS[2]  dead index  P:{Q}:dead:index
-- KEYS[3]  pending     P:{Q}:pending
-- KEYS[4]  stats       P:{Q}:stats       ("enqueued" and "revived" += the count)
-- KEYS[5]  wake        P:{Q}:wake
-- KEYS[6..] records    P:{Q}:job:<jid>   of the letters whose payload names a jid
-- ARGV     pairs: dead-letter id, the KEYS index of its record (0: none); oldest first,
--          so the oldest letter is claimed first (LPUSH in, RPOP out)
--
-- Reply: how many letters were re-enqueued.
--!include _wake.lua
--!include _prio.lua
--!include _env.lua
local n = 0
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  local raw = redis.call('HGET', KEYS[1], id)
  if raw then
    redis.call('HDEL', KEYS[1], id, id .. ':why')
    redis.call('ZREM', KEYS[2], id)
    push_pending(KEYS[3], raw, false)
    n = n + 1
    local k = tonumber(ARGV[i + 1])
    if k > 0 and redis.call('EXISTS', KEYS[k]) == 1 then
      redis.call('HDEL', KEYS[k], 'error', 'finished', 'token', 'result', 'progress')
      write_env(KEYS[k], raw, { 'state', 'pending' })
      redis.call('PERSIST', KEYS[k])
    end
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[4], 'enqueued', n)
  redis.call('HINCRBY', KEYS[4], 'revived', n)
  wake(KEYS[5])
end
return n
