-- Accept tasks that keep a record (keep_result > 0): as enqueue.lua, and each
-- task's record P:{Q}:job:<jid> is written afresh (a reused jid starts over)
-- with state "pending" or "scheduled". A record has no expiry while its task
-- is unfinished; finishing gives it its retention (_record.lua).
--
-- KEYS[1]  pending     P:{Q}:pending     LIST, LPUSH in / RPOP out
-- KEYS[2]  scheduled   P:{Q}:scheduled   ZSET envelope -> due ms
-- KEYS[3]  stats       P:{Q}:stats       HASH counters ("enqueued" += n)
-- KEYS[4]  wake        P:{Q}:wake        LIST wake marker
-- KEYS[5..4+n] records P:{Q}:job:<jid>   one per envelope, in order
-- ARGV[1]  delay in milliseconds, 0 for now
-- ARGV[2]  retention of the finished record in milliseconds
-- ARGV[3..2+n] envelopes (JSON)
--
-- Reply: the number of tasks accepted.
--!include _now_ms.lua
--!include _wake.lua
--!include _prio.lua
--!include _env.lua
local n = #ARGV - 2
if n < 1 then
  return 0
end
local now = now_ms()
local delay = tonumber(ARGV[1])
local state = 'pending'
if delay > 0 then
  state = 'scheduled'
end
for i = 1, n do
  local record = KEYS[4 + i]
  local envelope = ARGV[2 + i]
  redis.call('DEL', record)
  if delay > 0 then
    redis.call('ZADD', KEYS[2], now + delay, envelope)
    write_env(record, envelope, { 'state', state, 'enqueued', now, 'due', now + delay, 'keep', ARGV[2] }, true)
  else
    push_pending(KEYS[1], envelope, false)
    write_env(record, envelope, { 'state', state, 'enqueued', now, 'keep', ARGV[2] }, true)
  end
end
if delay == 0 then
  wake(KEYS[4])
end
redis.call('HINCRBY', KEYS[3], 'enqueued', n)
return n
