-- Rate limits at claim (docs/guides/flow.md). The consumer sends, for a queue whose
-- workers set rate_limit, a spec: { p = "P:{Q}:rate:", r = { {op, rate, burst}, ... } }
-- (rate in tasks per second). Each limited operation has a token bucket
-- P:{Q}:rate:<op> (HASH t = tokens, at = Redis TIME in us of the last
-- refill) refilled from Redis TIME, so every process on this Redis shares
-- it. A claimed task of a limited operation takes a token; the first one
-- that finds none goes back to the head of its list with every task claimed
-- after it (head of line: FIFO is kept, and the claim of this queue pauses),
-- and the reply says how many ms until the next token.
-- With spec.c = { op = max } (and spec.cp = "P:{Q}:", _slots.lua) a task of
-- such an operation carrying a concurrency key takes a slot of its key, or is
-- parked when the key is full (and does not block the tasks behind it); the
-- third result maps the index of each kept task that took a slot to its
-- slots key, for the caller to add the delivery's token.
-- Needs _prio.lua (push_pending) and _slots.lua (ckey_of).
local function flow_filter(pending, items, spec)
  local time = redis.call('TIME')
  local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local rates = {}
  for _, r in ipairs(spec.r or {}) do
    rates[r[1]] = r
  end
  local maxes = spec.c or {}
  local held = {}
  local slotted = {}
  local buckets = {}
  local kept = {}
  local wait = 0
  for i, envelope in ipairs(items) do
    local op = string.match(envelope, '"operation":"([^"\\]*)"')
    local r = op and rates[op]
    local max = op and maxes[op]
    local slots = nil
    if max then
      local key = ckey_of(envelope)
      if key then
        slots = spec.cp .. 'slots:' .. key
        if not held[slots] then
          held[slots] = redis.call('SCARD', slots)
        end
        if held[slots] >= max then
          redis.call('LPUSH', spec.cp .. 'parked:' .. key, envelope)
          redis.call('SADD', spec.cp .. 'parkedkeys', key)
          r = nil
          envelope = nil
        end
      end
    end
    if not envelope then
      -- parked: it waits for a slot of its key; the tasks behind it go on
    elseif r then
      local b = buckets[op]
      if not b then
        local key = spec.p .. op
        local saved = redis.call('HMGET', key, 't', 'at')
        local tokens = tonumber(saved[1])
        local at = tonumber(saved[2])
        if tokens and at then
          tokens = math.min(r[3], tokens + math.max(0, now_us - at) * r[2] / 1000000)
        else
          tokens = r[3]
        end
        b = { key = key, t = tokens, rate = r[2], burst = r[3] }
        buckets[op] = b
      end
      if b.t >= 1 then
        b.t = b.t - 1
        kept[#kept + 1] = envelope
        if slots then
          held[slots] = held[slots] + 1
          slotted[#kept] = slots
        end
      else
        wait = math.max(1, math.ceil((1 - b.t) * 1000 / b.rate))
        for j = #items, i, -1 do
          push_pending(pending, items[j], true)
        end
        break
      end
    else
      kept[#kept + 1] = envelope
      if slots then
        held[slots] = held[slots] + 1
        slotted[#kept] = slots
      end
    end
  end
  for _, b in pairs(buckets) do
    redis.call('HSET', b.key, 't', string.format('%.6f', b.t), 'at', string.format('%d', now_us))
    -- a bucket left alone refills to full: once it would have, the key is not needed
    redis.call('PEXPIRE', b.key, math.ceil(b.burst * 1000 / b.rate) + 1000)
  end
  return kept, wait, slotted
end
