-- Cancel a task: take it out of wherever it is and finish it as "cancelled".
-- A running delivery leaves its consumer's in-flight hash here, so from this
-- moment its ack and its fenced writes are refused; its jid and token are
-- published on the queue's cancel channel for the consumer to stop the
-- coroutine. A waiting task leaves the scheduled set, the queue, or the hash
-- of tasks held for their parents (dep_wait.lua). A task without a record is
-- looked for by its jid in every place (a scan, so its cost grows with the
-- queue); one with a record by its envelope.
--
-- KEYS[1]  record      P:{Q}:job:<jid>
-- KEYS[2]  pending     P:{Q}:pending
-- KEYS[3]  scheduled   P:{Q}:scheduled
-- KEYS[4]  stats       P:{Q}:stats        ("cancelled" += 1)
-- KEYS[5]  finished    P:{Q}:finished
-- KEYS[6..] inflight   P:{Q}:inflight:<consumer> of every registered consumer of Q
-- ARGV[1]  jid
-- ARGV[2]  the cancel channel P:{Q}:cancel (SPUBLISH "<jid> <token>")
-- ARGV[3]  how many finished records the queue keeps
-- ARGV[4]  the done channel P:{Q}:done: the jid is published there once its
--          record says "cancelled", so a waiting result() wakes
--
-- A running delivery's "<jid> <token>" also goes on P:{Q}:cancelled (ZSET,
-- scored by the token; the newest CANCELS_KEPT, for an hour after the last
-- cancel): a consumer whose subscription dropped when it was published reads
-- it there once it has subscribed again (consume/_cancels.py).
--
-- A batch child leaves its note "<bid> <jid> c" on P:{Q}:notes (_note.lua).
--
-- Reply: { cancelled, where }
--   cancelled  1 when this call cancelled it, else 0
--   where      "running", "scheduled", "pending" or "waiting" (where it was), the final
--              state when it had finished already, "" when not found
--!include _now_ms.lua
--!include _record.lua
--!include _prio.lua
--!include _wake.lua
--!include _slots.lua
--!include _note.lua
--!include _ckpt.lua
--!include _env.lua
local CANCELS_KEPT = 1000
local jid = ARGV[1]
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'pending' and state ~= 'scheduled' and state ~= 'waiting' then
  return { 0, state }
end
local needle = '{"jid":"' .. jid .. '"'
local function mine(envelope)
  return string.sub(envelope, 1, #needle) == needle
end

local function cancelled(where, envelope, token)
  redis.call('HINCRBY', KEYS[4], 'cancelled', 1)
  note_final(KEYS[4], envelope, 'c')
  drop_state(KEYS[4], envelope)
  if state then
    local now = now_ms()
    local keep = tonumber(redis.call('HGET', KEYS[1], 'keep') or '1')
    local fields = { 'state', 'cancelled', 'finished', now }
    if token then
      fields[#fields + 1] = 'token'
      fields[#fields + 1] = token
    end
    finish_record(KEYS[1], KEYS[5], fields, keep)
    trim_records(KEYS[5], tonumber(ARGV[3]))
    redis.call('SPUBLISH', ARGV[4], jid)
  end
  return { 1, where }
end

if state == 'waiting' then -- held for its parents (dep_wait.lua)
  local entry = redis.call('HGET', queue_base(KEYS[2]) .. 'waiting', jid)
  if not entry then
    return { 0, '' }
  end
  redis.call('HDEL', queue_base(KEYS[2]) .. 'waiting', jid)
  return cancelled('waiting', cjson.decode(entry)['env'])
end

for i = 6, #KEYS do
  local entries = redis.call('HGETALL', KEYS[i])
  for j = 1, #entries, 2 do
    if mine(entries[j + 1]) then
      redis.call('HDEL', KEYS[i], entries[j])
      release_slot(queue_base(KEYS[2]), entries[j + 1], entries[j])
      redis.call('SPUBLISH', ARGV[2], jid .. ' ' .. entries[j])
      local log = queue_base(KEYS[2]) .. 'cancelled'
      redis.call('ZADD', log, entries[j], jid .. ' ' .. entries[j])
      redis.call('ZREMRANGEBYRANK', log, 0, -(CANCELS_KEPT + 1))
      redis.call('PEXPIRE', log, 3600000)
      return cancelled('running', entries[j + 1], entries[j])
    end
  end
end

local envelope = record_env(KEYS[1])
if envelope then
  if redis.call('ZREM', KEYS[3], envelope) == 1 then
    return cancelled('scheduled', envelope)
  end
  local home = home_list(KEYS[2], envelope)
  if redis.call('LREM', home, 1, envelope) == 1 then
    fair_taken(KEYS[2], home, 1)
    return cancelled('pending', envelope)
  end
  local key = ckey_of(envelope)
  if key and redis.call('LREM', queue_base(KEYS[2]) .. 'parked:' .. key, 1, envelope) == 1 then
    return cancelled('pending', envelope)
  end
  local op = string.match(envelope, '"operation":"([^"\\]*)"')
  local rkey = op and head_field(envelope, 'rkey')
  if rkey then
    op = op .. '\31' .. rkey
  end
  if op and redis.call('LREM', queue_base(KEYS[2]) .. 'rparked:' .. op, 1, envelope) == 1 then
    return cancelled('pending', envelope)  -- parked for a token: its op's restore skips an emptied list
  end
  return { 0, '' }
end

local later = redis.call('ZRANGE', KEYS[3], 0, -1)
for _, item in ipairs(later) do
  if mine(item) then
    redis.call('ZREM', KEYS[3], item)
    return cancelled('scheduled', item)
  end
end
for _, list in ipairs(waiting_lists(KEYS[2])) do
  local n = redis.call('LLEN', list)
  for start = 0, n - 1, 10000 do
    local items = redis.call('LRANGE', list, start, start + 9999)
    for _, item in ipairs(items) do
      if mine(item) then
        fair_taken(KEYS[2], list, redis.call('LREM', list, 1, item))
        return cancelled('pending', item)
      end
    end
  end
end
return { 0, '' }
