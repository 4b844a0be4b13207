-- Accept tasks a relay took from the SQL outbox (fencekit.services.relay), each
-- at most once: a task whose marker P:{Q}:relayed:<jid> exists was pushed
-- already (by a relay that died before its row's delete committed) and is
-- skipped, whether or not it still lives. The relay removes the markers once
-- the delete committed (outbox_forget.lua); a marker left by a crash expires
-- after ARGV[1] ms.
--
-- KEYS[1]  pending     P:{Q}:pending
-- KEYS[2]  scheduled   P:{Q}:scheduled
-- KEYS[3]  stats       P:{Q}:stats       ("enqueued" += created, "deduped" += skipped)
-- KEYS[4]  wake        P:{Q}:wake
-- KEYS[5..]  per task i (i = 1..n) two keys: KEYS[3+2i] its record P:{Q}:job:<jid> (written
--            when it keeps one), KEYS[4+2i] its marker P:{Q}:relayed:<jid>
-- ARGV[1]  how long a marker outlives a crashed relay, in ms
-- ARGV[3i-1]  delay of task i in ms, 0 for now
-- ARGV[3i]    retention of task i's record in ms, 0 for no record
-- ARGV[3i+1]  envelope of task i (JSON)
--
-- Reply: the number of tasks created (the others were pushed before).
--!include _now_ms.lua
--!include _wake.lua
--!include _prio.lua
--!include _env.lua
local n = (#ARGV - 1) / 3
local now = now_ms()
local created = 0
local woken = false
for i = 1, n do
  local record, marker = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
  local delay, keep, envelope = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), ARGV[3 * i + 1]
  if redis.call('SET', marker, '1', 'NX', 'PX', ARGV[1]) then
    created = created + 1
    if keep > 0 then
      redis.call('DEL', record)
    end
    if delay > 0 then
      redis.call('ZADD', KEYS[2], now + delay, envelope)
      if keep > 0 then
        write_env(record, envelope, { 'state', 'scheduled', 'enqueued', now, 'due', now + delay, 'keep', keep },
          true)
      end
    else
      push_pending(KEYS[1], envelope, false)
      woken = true
      if keep > 0 then
        write_env(record, envelope, { 'state', 'pending', 'enqueued', now, 'keep', keep }, true)
      end
    end
  end
end
if woken then
  wake(KEYS[4])
end
if created > 0 then
  redis.call('HINCRBY', KEYS[3], 'enqueued', created)
end
if created < n then
  redis.call('HINCRBY', KEYS[3], 'deduped', n - created)
end
return created
