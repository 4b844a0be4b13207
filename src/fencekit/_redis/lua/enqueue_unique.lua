-- Accept one task unless a task with its unique key lives: the dedupe of
-- Task(unique_key=...). The unique key names the jid of the task that holds
-- it; that task "lives" while its record exists (pending, scheduled,
-- running, or finished and not yet forgotten), so a duplicate gets the
-- existing jid, and its result, instead of a second task. Decided here, in
-- one script: concurrent producers cannot both create.
--
-- KEYS[1]  pending     P:{Q}:pending
-- KEYS[2]  scheduled   P:{Q}:scheduled
-- KEYS[3]  stats       P:{Q}:stats       ("enqueued" += 1, or "deduped" += 1)
-- KEYS[4]  wake        P:{Q}:wake
-- KEYS[5]  record      P:{Q}:job:<jid>   of the new task
-- KEYS[6]  unique      P:{Q}:unique:<key>
-- ARGV[1]  delay in milliseconds, 0 for now
-- ARGV[2]  retention of the finished record in milliseconds (> 0)
-- ARGV[3]  envelope (JSON)
-- ARGV[4]  jid of the new task
-- ARGV[5]  the record key prefix P:{Q}:job: (the holder's record is it + its jid)
-- ARGV[6]  how long the key dedupes at most, in ms (0: while its task lives)
--
-- Reply: { created, jid }  created 1 with the new jid, 0 with the holder's jid.
--!include _now_ms.lua
--!include _wake.lua
--!include _prio.lua
--!include _env.lua
local holder = redis.call('GET', KEYS[6])
if holder and redis.call('EXISTS', ARGV[5] .. holder) == 1 then
  redis.call('HINCRBY', KEYS[3], 'deduped', 1)
  return { 0, holder }
end
if tonumber(ARGV[6]) > 0 then
  redis.call('SET', KEYS[6], ARGV[4], 'PX', ARGV[6])
else
  redis.call('SET', KEYS[6], ARGV[4])
end
local now = now_ms()
local delay = tonumber(ARGV[1])
local held = string.sub(KEYS[6], #ARGV[5] - #'job:' + #'unique:' + 1) -- <key>: "uk" (_record.lua)
redis.call('DEL', KEYS[5])
if delay > 0 then
  redis.call('ZADD', KEYS[2], now + delay, ARGV[3])
  write_env(KEYS[5], ARGV[3], { 'state', 'scheduled', 'enqueued', now, 'due', now + delay,
    'keep', ARGV[2], 'uk', held }, true)
else
  push_pending(KEYS[1], ARGV[3], false)
  write_env(KEYS[5], ARGV[3], { 'state', 'pending', 'enqueued', now, 'keep', ARGV[2],
    'uk', held }, true)
  wake(KEYS[4])
end
redis.call('HINCRBY', KEYS[3], 'enqueued', 1)
return { 1, ARGV[4] }
