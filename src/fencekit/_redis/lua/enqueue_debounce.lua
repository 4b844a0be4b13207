-- Accept a debounced task (Task(debounce_key=..., debounce=...)): enqueues of
-- one key within the window replace the waiting one, which runs once the
-- window passes without a new enqueue (or debounce_max after the first).
-- The key P:{Q}:debounce:<key> (HASH jid, env, first) names the waiting task;
-- it waits on the scheduled set, due at the window's end. While it is still
-- there (not moved to pending, not started), a new enqueue takes its place:
-- the new envelope, under the waiting task's jid, due a window from now (or
-- at first + max), and the caller is given that jid. Otherwise the call
-- starts a new window with its own task.
--
-- KEYS[1]  scheduled   P:{Q}:scheduled
-- KEYS[2]  stats       P:{Q}:stats        ("enqueued" += 1, or "debounced" += 1)
-- KEYS[3]  record      P:{Q}:job:<jid>    of the new task (written when it keeps one)
-- KEYS[4]  debounce    P:{Q}:debounce:<key>
-- ARGV[1]  the window in ms (> 0)
-- ARGV[2]  the longest wait from the window's first enqueue in ms (0: none)
-- ARGV[3]  envelope (JSON) of the new task, its jid first
-- ARGV[4]  jid of the new task
-- ARGV[5]  the record key prefix P:{Q}:job:
-- ARGV[6]  retention of the record in ms (0: no record)
--
-- Reply: { created, jid }  created 1 with the new jid, 0 with the waiting task's jid.
--!include _now_ms.lua
--!include _env.lua
local now = now_ms()
local window, most, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[6])
local held = redis.call('HMGET', KEYS[4], 'jid', 'env', 'first')
if held[1] and redis.call('ZSCORE', KEYS[1], held[2]) then
  local jid = held[1]
  -- the new envelope under the waiting jid (jids hold no character JSON escapes)
  local envelope = '{"jid":"' .. jid .. '"' .. string.sub(ARGV[3], #('{"jid":"' .. ARGV[4] .. '"') + 1)
  local due = now + window
  if most > 0 then
    due = math.min(due, tonumber(held[3]) + most)
  end
  redis.call('ZREM', KEYS[1], held[2])
  redis.call('ZADD', KEYS[1], due, envelope)
  redis.call('HSET', KEYS[4], 'env', envelope)
  redis.call('PEXPIRE', KEYS[4], due - now + window)
  local record = ARGV[5] .. jid
  if redis.call('EXISTS', record) == 1 then
    write_env(record, envelope, { 'due', due })
  end
  redis.call('HINCRBY', KEYS[2], 'debounced', 1)
  return { 0, jid }
end
local due = now + window
if most > 0 then
  due = math.min(due, now + most)
end
redis.call('ZADD', KEYS[1], due, ARGV[3])
if keep > 0 then
  redis.call('DEL', KEYS[3])
  write_env(KEYS[3], ARGV[3], { 'state', 'scheduled', 'enqueued', now, 'due', due, 'keep', keep }, true)
end
redis.call('DEL', KEYS[4])
redis.call('HSET', KEYS[4], 'jid', ARGV[4], 'env', ARGV[3], 'first', now)
redis.call('PEXPIRE', KEYS[4], due - now + window)
redis.call('HINCRBY', KEYS[2], 'enqueued', 1)
return { 1, ARGV[4] }
