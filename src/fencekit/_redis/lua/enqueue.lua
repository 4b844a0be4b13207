-- Accept tasks into a queue: now (pending list) or after a delay (scheduled set).
--
-- KEYS[1]  pending     P:{Q}:pending     LIST, LPUSH in / RPOP out
-- KEYS[2]  scheduled   P:{Q}:scheduled   ZSET envelope -> due ms
-- KEYS[3]  stats       P:{Q}:stats       HASH counters ("enqueued" += n)
-- KEYS[4]  wake        P:{Q}:wake        LIST wake marker
-- ARGV[1]  delay in milliseconds, 0 for now
-- ARGV[2..] envelopes (JSON)
--
-- Reply: the number of tasks accepted.
--!include _now_ms.lua
--!include _wake.lua
--!include _prio.lua
local n = #ARGV - 1
if n < 1 then
  return 0
end
local delay = tonumber(ARGV[1])
if delay > 0 then
  local due = now_ms() + delay
  for i = 2, #ARGV do
    redis.call('ZADD', KEYS[2], due, ARGV[i])
  end
else
  local plain = true
  for i = 2, #ARGV do
    if prio_of(ARGV[i]) ~= 0 or fair_of(ARGV[i]) then
      plain = false
      break
    end
  end
  if plain then
    for i = 2, #ARGV, 1000 do
      redis.call('LPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
    end
  else
    for i = 2, #ARGV do
      push_pending(KEYS[1], ARGV[i], false)
    end
  end
  wake(KEYS[4])
end
redis.call('HINCRBY', KEYS[3], 'enqueued', n)
return n
