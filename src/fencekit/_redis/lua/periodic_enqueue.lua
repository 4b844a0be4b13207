-- Enqueue the due ticks of one schedule, each tick at most once across every
-- host: P:{Q}:cron:<operation> holds the newest tick enqueued, and only ticks
-- newer than it are enqueued, in the same script as the LPUSH. Hosts that
-- run the same schedule all call this; a host that was paused, or whose
-- clock is behind, proposes ticks that are not newer and enqueues nothing.
-- Each run is a task that keeps a record (P:{Q}:job:<jid>), written as
-- enqueue_tracked.lua writes it, so a run is found by its jid.
--
-- KEYS[1]  last        P:{Q}:cron:<operation>  STRING newest tick enqueued (Unix ms)
-- KEYS[2]  pending     P:{Q}:pending           LIST, LPUSH in / RPOP out (a run of
--                                              priority p goes to p's list: _prio.lua)
-- KEYS[3]  stats       P:{Q}:stats             HASH counters ("enqueued" += n)
-- KEYS[4]  wake        P:{Q}:wake              LIST wake marker
-- KEYS[5..4+n] records P:{Q}:job:<jid>         one per tick, in order (KEYS[4+i]: tick i)
-- ARGV[1]  floor (ms): when KEYS[1] is missing (a new schedule, or Redis lost
--          its data), ticks below it are not enqueued
-- ARGV[2]  retention of a finished run's record in milliseconds
-- ARGV[1+2i], ARGV[2+2i]  tick i (Unix ms, ascending) and its envelope (JSON)
--
-- Reply: { enqueued, newest }  how many ticks this call enqueued, and the
-- newest tick enqueued by anyone (-1: none yet).
--!include _now_ms.lua
--!include _wake.lua
--!include _prio.lua
local stored = redis.call('GET', KEYS[1])
local newest = tonumber(stored or '-1')
local floor = -1
if not stored then
  floor = tonumber(ARGV[1])
end
local newest_text = nil
local n = 0
local now = nil
for i = 1, (#ARGV - 2) / 2 do
  local text = ARGV[1 + 2 * i]
  local tick = tonumber(text)
  if tick > newest and tick >= floor then
    local record = KEYS[4 + i]
    local envelope = ARGV[2 + 2 * i]
    if not now then
      now = now_ms()
    end
    redis.call('DEL', record)
    push_pending(KEYS[2], envelope, false)
    redis.call('HSET', record, 'env', envelope, 'state', 'pending', 'enqueued', now, 'keep', ARGV[2])
    newest = tick
    newest_text = text
    n = n + 1
  end
end
if n > 0 then
  redis.call('SET', KEYS[1], newest_text)
  redis.call('HINCRBY', KEYS[3], 'enqueued', n)
  wake(KEYS[4])
end
if stored and not newest_text then
  return { 0, stored }
end
return { n, newest_text or '-1' }
