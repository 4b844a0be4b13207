-- Schedule a failed delivery to run again after a delay (retry policy said yes).
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>
-- KEYS[2]  scheduled   P:{Q}:scheduled
-- KEYS[3]  stats       P:{Q}:stats                ("retried" or "fenced_out")
-- KEYS[4]  record      P:{Q}:job:<jid>            (optional) updated if it exists
-- ARGV[1]  token of the delivery
-- ARGV[2]  delay in milliseconds
-- ARGV[3]  envelope of the next attempt (attempt + 1)
-- ARGV[4]  the attempt's error (JSON), kept in the record ("" without KEYS[4])
--
-- Reply: 1 when scheduled.
-- Error: "FENCED ..." when the token is no longer this consumer's delivery
--        (it was reaped or returned meanwhile); counted as fenced_out.
--!include _now_ms.lua
--!include _record.lua
--!include _prio.lua
--!include _wake.lua
--!include _slots.lua
--!include _ckpt.lua
--!include _env.lua
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then
  redis.call('HINCRBY', KEYS[3], 'fenced_out', 1)
  return redis.error_reply('FENCED delivery ' .. ARGV[1] .. ' is no longer current')
end
redis.call('HDEL', KEYS[1], ARGV[1])
local envelope = carry_mark(old, ARGV[3]) -- a checkpointed task resumes from its state
local now = now_ms()
local due = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], due, envelope)
redis.call('HINCRBY', KEYS[3], 'retried', 1)
release_slot(queue_base(KEYS[1]), envelope, ARGV[1])
if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1 then
  write_env(KEYS[4], envelope, { 'state', 'scheduled', 'due', due, 'token', ARGV[1], 'error', ARGV[4] })
  note_run(KEYS[4], ARGV[1], now, 'retried', KEYS[1])
end
return 1
