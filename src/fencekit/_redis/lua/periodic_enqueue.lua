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
-- ARGV[3]  1: collapse (catch-up off): of the ticks at or before Redis's clock,
--          only the newest is enqueued (after downtime, one run for the missed
--          ticks); a tick after Redis's clock, proposed early by a host whose
--          clock is ahead, is not a missed tick and is enqueued as it comes.
--          0: every tick (catch-up on)
-- ARGV[2+2i], ARGV[3+2i]  tick i (Unix ms, ascending) and its envelope (JSON)
--
-- Reply: { enqueued, newest }  how many ticks this call enqueued, and the
-- newest tick enqueued by anyone (-1: none yet).
--!include _now_ms.lua
--!include _wake.lua
--!include _prio.lua
--!include _env.lua
local stored = redis.call('GET', KEYS[1])
local newest = tonumber(stored or '-1')
local floor = -1
if not stored then
  floor = tonumber(ARGV[1])
end
local newest_text = nil
local n = 0
local count = (#ARGV - 3) / 2
local now = now_ms()
local newest_past = 0 -- the index of the newest tick at or before now (0: none)
if ARGV[3] == '1' then
  for i = 1, count do
    if tonumber(ARGV[2 + 2 * i]) <= now then
      newest_past = i
    end
  end
end
for i = 1, count do
  local text = ARGV[2 + 2 * i]
  local tick = tonumber(text)
  if tick > newest and tick >= floor and (i >= newest_past or tick > now) then
    local record = KEYS[4 + i]
    local envelope = ARGV[3 + 2 * i]
    redis.call('DEL', record)
    push_pending(KEYS[2], envelope, false)
    write_env(record, envelope, { 'state', 'pending', 'enqueued', now, 'keep', ARGV[2] }, true)
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
