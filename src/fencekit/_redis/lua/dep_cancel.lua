-- Cancel a waiting task because a parent will never succeed (failed for good,
-- cancelled, expired or gone): its record says "cancelled" with the reason, a
-- waiting result() wakes, and its own dependants see it cancelled in turn. A
-- batch child leaves its note "<bid> <jid> c" (_note.lua).
--
-- KEYS[1]  waiting     P:{Q}:waiting
-- KEYS[2]  stats       P:{Q}:stats       ("cancelled" += 1)
-- KEYS[3]  record      P:{Q}:job:<jid>
-- KEYS[4]  finished    P:{Q}:finished
-- ARGV[1]  jid
-- ARGV[2]  the reason (JSON error: type, message)
-- ARGV[3]  how many finished records the queue keeps
-- ARGV[4]  the done channel P:{Q}:done
--
-- Reply: 1 when cancelled, 0 when it was not waiting.
--!include _now_ms.lua
--!include _record.lua
--!include _note.lua
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[2], 'cancelled', 1)
note_final(KEYS[2], cjson.decode(entry)['env'], 'c')
if redis.call('EXISTS', KEYS[3]) == 1 then
  local keep = tonumber(redis.call('HGET', KEYS[3], 'keep') or '1')
  finish_record(KEYS[3], KEYS[4], { 'state', 'cancelled', 'error', ARGV[2], 'finished', now_ms() }, keep)
  trim_records(KEYS[4], tonumber(ARGV[3]))
end
redis.call('SPUBLISH', ARGV[4], ARGV[1])
return 1
