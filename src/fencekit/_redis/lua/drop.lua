-- Finish an in-flight delivery without running it: its task expired before it
-- started. It leaves the in-flight hash and is counted under ARGV[2] (for
-- example "expired"). As in fail.lua no fence is raised: the delivery never
-- ran, and once it has left the hash job_set.lua refuses its writes. The
-- task's record, if it has one, takes the state ARGV[2] and its retention.
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>
-- KEYS[2]  stats       P:{Q}:stats
-- KEYS[3]  record      P:{Q}:job:<jid>     (optional, with 4)
-- KEYS[4]  finished    P:{Q}:finished
-- ARGV[1]  token of the delivery
-- ARGV[2]  the counter of the stats hash to raise, and the record's state
-- ARGV[3]  how many finished records to keep (with KEYS[3])
-- ARGV[4]  the done channel P:{Q}:done (with KEYS[3]): the jid is published
--          there once its record is final, so a waiting result() wakes
-- ARGV[5]  the jid (with KEYS[3])
--
-- A batch child leaves its note "<bid> <jid> c" on P:{Q}:notes (_note.lua).
--
-- Reply: 1 when dropped.
-- Error: "FENCED ..." when the token is no longer this consumer's delivery;
--        counted as fenced_out, nothing else changes.
--!include _now_ms.lua
--!include _record.lua
--!include _prio.lua
--!include _wake.lua
--!include _slots.lua
--!include _note.lua
--!include _ckpt.lua
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw or redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  redis.call('HINCRBY', KEYS[2], 'fenced_out', 1)
  return redis.error_reply('FENCED delivery ' .. ARGV[1] .. ' is no longer current')
end
release_slot(queue_base(KEYS[1]), raw, ARGV[1])
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
note_final(KEYS[2], raw, 'c')
drop_state(KEYS[2], raw)
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then
  local now = now_ms()
  local keep = tonumber(redis.call('HGET', KEYS[3], 'keep') or '0')
  finish_record(KEYS[3], KEYS[4], { 'state', ARGV[2], 'finished', now, 'token', ARGV[1] }, keep)
  trim_records(KEYS[4], tonumber(ARGV[3]))
  redis.call('SPUBLISH', ARGV[4], ARGV[5])
end
return 1
