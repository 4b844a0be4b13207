-- Finish an in-flight delivery as failed: retries exhausted or off (counted
-- "failed"), or bad input (also "dead", and kept as a dead letter with its
-- raw payload and the reason, for an operator). No fence is raised: the
-- delivery leaves its in-flight hash, so job_set.lua refuses its writes, and
-- any older delivery was fenced when it was reaped or returned.
-- With KEYS[5..7] a failure is kept as the task's record (state "failed",
-- its envelope and error, no expiry) in the failed index, the newest
-- ARGV[6] kept; a dead letter's record, if the task has one, becomes "dead"
-- and is retained as a finished record.
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>
-- KEYS[2]  stats       P:{Q}:stats
-- KEYS[3]  dead        P:{Q}:dead         HASH id -> raw, "<id>:why" -> JSON
-- KEYS[4]  dead index  P:{Q}:dead:index   ZSET id -> ms
-- KEYS[5]  record      P:{Q}:job:<jid>    (optional, with 6 and 7)
-- KEYS[6]  failed      P:{Q}:failed       LIST record keys, newest first
-- KEYS[7]  finished    P:{Q}:finished     LIST record keys, newest first
-- ARGV[1]  token of the delivery
-- ARGV[2]  dead-letter record (JSON with the reason), "" for a plain failure
-- ARGV[3]  dead-letter id
-- ARGV[4]  how many dead letters to keep (oldest dropped beyond)
-- ARGV[5]  the error (JSON: type, message, traceback) for the record
-- ARGV[6]  how many failed records to keep
-- ARGV[7]  how many finished records to keep
-- ARGV[8]  the done channel P:{Q}:done (with KEYS[5]): the jid is published
--          there once its record is final, so a waiting result() wakes
-- ARGV[9]  the jid (with KEYS[5])
--
-- A batch child (its envelope names the batch) leaves its note "<bid> <jid> f"
-- on P:{Q}:notes (_note.lua).
--
-- Reply: 1 when finished.
-- Error: "FENCED ..." when the token is no longer this consumer's delivery;
--        counted as fenced_out, nothing else changes.
--!include _now_ms.lua
--!include _record.lua
--!include _prio.lua
--!include _wake.lua
--!include _slots.lua
--!include _note.lua
--!include _ckpt.lua
--!include _env.lua
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  redis.call('HINCRBY', KEYS[2], 'fenced_out', 1)
  return redis.error_reply('FENCED delivery ' .. ARGV[1] .. ' is no longer current')
end
redis.call('HDEL', KEYS[1], ARGV[1])
release_slot(queue_base(KEYS[1]), raw, ARGV[1])
redis.call('HINCRBY', KEYS[2], 'failed', 1)
note_final(KEYS[2], raw, 'f')
drop_state(KEYS[2], raw)
local now = now_ms()
if ARGV[2] ~= '' then
  redis.call('HINCRBY', KEYS[2], 'dead', 1)
  redis.call('HSET', KEYS[3], ARGV[3], raw, ARGV[3] .. ':why', ARGV[2])
  redis.call('ZADD', KEYS[4], now, ARGV[3])
  local excess = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[4])
  if excess > 0 then
    local old = redis.call('ZRANGE', KEYS[4], 0, excess - 1)
    for _, id in ipairs(old) do
      redis.call('HDEL', KEYS[3], id, id .. ':why')
    end
    redis.call('ZREMRANGEBYRANK', KEYS[4], 0, excess - 1)
  end
  if KEYS[5] and redis.call('EXISTS', KEYS[5]) == 1 then
    local keep = tonumber(redis.call('HGET', KEYS[5], 'keep') or '0')
    finish_record(KEYS[5], KEYS[7], { 'state', 'dead', 'error', ARGV[5], 'finished', now,
      'token', ARGV[1] }, keep)
    note_run(KEYS[5], ARGV[1], now, 'dead', KEYS[1])
    trim_records(KEYS[7], tonumber(ARGV[7]))
    redis.call('SPUBLISH', ARGV[8], ARGV[9])
  end
elseif KEYS[5] then
  local fields, chunks = env_fields(raw, { 'state', 'failed', 'error', ARGV[5], 'finished', now,
    'token', ARGV[1] })
  finish_record(KEYS[5], KEYS[6], fields, 0)
  drop_env_tail(KEYS[5], chunks)
  note_run(KEYS[5], ARGV[1], now, 'failed', KEYS[1])
  trim_records(KEYS[6], tonumber(ARGV[6]))
  redis.call('SPUBLISH', ARGV[8], ARGV[9])
end
return 1
