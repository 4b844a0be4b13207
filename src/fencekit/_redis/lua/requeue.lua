-- Put an in-flight delivery back at the head of its queue: a crash recovered
-- by the reaper (attempt + 1, counted "retried"), or a task returned
-- unfinished by a consumer that stops (same attempt, no counter).
-- The job's fence is raised past the delivery, so its writes are refused.
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>
-- KEYS[2]  pending     P:{Q}:pending
-- KEYS[3]  stats       P:{Q}:stats
-- KEYS[4]  wake        P:{Q}:wake
-- KEYS[5]  job fence   P:fence:{Q}:job:<jid>
-- KEYS[6]  record      P:{Q}:job:<jid>            (optional) updated if it exists
-- ARGV[1]  token of the delivery
-- ARGV[2]  envelope to queue
-- ARGV[3]  stats field to increment, "" for none
-- ARGV[4]  expiry of the job fence key in milliseconds
-- ARGV[5]  (optional) how the record's runs line names the run: "interrupted"
--          (a stop interrupted it at a checkpoint); else "crashed" with a
--          counter, "returned" without
--
-- Reply: 1 when moved.
-- Error: "FENCED ..." when the delivery is gone (acknowledged, or moved by
--        another reaper) — nothing changes.
--!include _now_ms.lua
--!include _record.lua
--!include _wake.lua
--!include _fence_past.lua
--!include _prio.lua
--!include _slots.lua
--!include _ckpt.lua
--!include _env.lua
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then
  return redis.error_reply('FENCED delivery ' .. ARGV[1] .. ' is no longer in flight')
end
redis.call('HDEL', KEYS[1], ARGV[1])
local envelope = carry_mark(old, ARGV[2]) -- a checkpointed task resumes from its state
release_slot(queue_base(KEYS[1]), envelope, ARGV[1])
push_pending(KEYS[2], envelope, true)
wake(KEYS[4])
if ARGV[3] ~= '' then
  redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
end
fence_past(KEYS[5], ARGV[1], ARGV[4])
if KEYS[6] and redis.call('EXISTS', KEYS[6]) == 1 then
  write_env(KEYS[6], envelope, { 'state', 'pending', 'token', ARGV[1] })
  redis.call('HDEL', KEYS[6], 'due')
  note_run(KEYS[6], ARGV[1], now_ms(), ARGV[5] or (ARGV[3] ~= '' and 'crashed' or 'returned'), KEYS[1])
end
return 1
