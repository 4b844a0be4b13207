-- Rate limits at claim (docs/guides/flow.md). The consumer sends, for a queue whose
-- workers set rate_limit, a spec: { p = "P:{Q}:rate:", r = { {op, rate, burst}, ... } }
-- (rate in tasks per second). Each limited operation has a token bucket
-- P:{Q}:rate:<op> (HASH t = tokens, at = Redis TIME in us of the last
-- refill) refilled from Redis TIME, so every process on this Redis shares
-- it; a task whose head carries "rkey":<key> (a per-key rate limit) uses the
-- bucket of <op>\31<key> instead, and parks under that name (below). A claimed task of a limited operation takes a token; one that finds
-- none is parked on P:{Q}:rparked:<op> (LPUSH in, RPOP out), and so is every
-- later task of that operation while the list holds any (FIFO within the
-- operation), while the claim goes on with the queue's other tasks: no head
-- of line. The ZSET P:{Q}:rparkedops holds each operation with parked tasks,
-- scored with the ms its next token is due, and the HASH P:{Q}:rparkedspec
-- its "rate burst". A claim first takes the due operations' oldest parked
-- tasks, as many as their bucket has tokens (rate_restore: the first
-- `restored` items of the filter, exempt from parking behind their list);
-- the scheduler (schedule.lua) on every host wakes the queue's consumers
-- when a parked operation's token is due, for a consumer that parked them
-- and died.
-- The reply's wait is the ms until the earliest parked operation's token (0:
-- none parked): the consumer looks at the queue again then.
-- With spec.c = { op = max } (and spec.cp = "P:{Q}:", _slots.lua) a task of
-- such an operation carrying a concurrency key takes a slot of its key, or is
-- parked when the key is full (and does not block the tasks behind it); the
-- third result maps the index of each kept task that took a slot to its
-- slots key, for the caller to add the delivery's token.
-- Needs _prio.lua (push_pending), _now_ms.lua, _slots.lua (ckey_of) and
-- _clock.lua: the parked tasks restored, the buckets refilled and stamped and
-- the claim's delivery tokens all read the script's one clock (two readings let
-- a restore see fewer tokens than the filter then granted and stored).
local function rate_tokens(saved, rate, burst, now_us)
  local tokens = tonumber(saved[1])
  local at = tonumber(saved[2])
  if tokens and at then
    return math.min(burst, tokens + math.max(0, now_us - at) * rate / 1000000)
  end
  return burst
end
-- The oldest parked tasks of each operation whose token is due, as many as
-- its bucket holds and at most limit in all, oldest first, taken off their
-- lists for the claim that calls (flow_filter gives them their tokens first).
local function rate_restore(base, limit)
  local now_us = clock_us()
  local now = math.floor(now_us / 1000)
  local out = {}
  for _, op in ipairs(redis.call('ZRANGEBYSCORE', base .. 'rparkedops', '-inf', now, 'LIMIT', 0, 16)) do
    local list = base .. 'rparked:' .. op
    local spec = redis.call('HGET', base .. 'rparkedspec', op)
    local rate, burst = 1, 1
    if spec then
      local r, b = string.match(spec, '^(%S+) (%S+)$')
      rate, burst = tonumber(r), tonumber(b)
    end
    local tokens = rate_tokens(redis.call('HMGET', base .. 'rate:' .. op, 't', 'at'), rate, burst, now_us)
    local n = math.min(math.floor(tokens), limit - #out)
    if n >= 1 then
      local got = redis.call('RPOP', list, n)
      if got then
        for _, envelope in ipairs(got) do
          out[#out + 1] = envelope
        end
      end
    end
    if redis.call('EXISTS', list) == 1 then
      local due = now + math.max(1, math.ceil((math.max(n, 0) + 1 - tokens) * 1000 / rate))
      redis.call('ZADD', base .. 'rparkedops', due, op)
    else
      redis.call('ZREM', base .. 'rparkedops', op)
      redis.call('HDEL', base .. 'rparkedspec', op)
    end
    if #out >= limit then
      break
    end
  end
  return out
end
-- ms until the earliest parked operation's token is due, 0 when none is parked.
local function rate_wait(base, now)
  local next_due = redis.call('ZRANGE', base .. 'rparkedops', 0, 0, 'WITHSCORES')
  if next_due[2] then
    return math.max(1, tonumber(next_due[2]) - now)
  end
  return 0
end
-- The claim's filter: items (the restored ones first, then those popped)
-- examined in order until want are kept; a parked one is replaced by the
-- next task popped with more(n) (at most SCAN_CAP looked at in all), so the
-- claim fills from the tasks behind a parked operation; the ones not looked
-- at go back to the head, in their order. Returns kept, wait, slotted, how
-- many more() popped, and whether it stopped at SCAN_CAP.
local SCAN_CAP = 128 -- bounds one claim's work; the claim wakes the queue again if it stopped here
local function flow_filter(pending, items, spec, restored, want, more)
  local now_us = clock_us()
  local base = string.sub(pending, 1, #pending - #'pending')
  local parked = {} -- op -> its rparked list holds tasks (FIFO: later ones park behind them)
  local rates = {}
  for _, r in ipairs(spec.r or {}) do
    rates[r[1]] = r
  end
  local maxes = spec.c or {}
  local held = {}
  local slotted = {}
  local buckets = {}
  local kept = {}
  local batch, at, i, extra, any_parked, capped = items, 1, 0, 0, false, false
  while #kept < want do
    local envelope = batch[at]
    if not envelope then
      if not any_parked or i >= SCAN_CAP then
        capped = any_parked
        break
      end
      local got = more(math.min(math.max(want - #kept, 32), SCAN_CAP - i))
      if not got then
        break
      end
      batch = got
      extra = extra + #batch
      at = 1
      envelope = batch[1]
    end
    at = at + 1
    i = i + 1
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
          any_parked = true
          r = nil
          envelope = nil
        end
      end
    end
    if not envelope then
      -- parked: it waits for a slot of its key; the tasks behind it go on
    elseif r then
      local name = op -- the bucket: the operation's, or with a rate key that key's own
      local rkey = head_field(envelope, 'rkey')
      if rkey then
        name = op .. '\31' .. rkey
      end
      local b = buckets[name]
      if not b then
        local key = spec.p .. name
        local tokens = rate_tokens(redis.call('HMGET', key, 't', 'at'), r[2], r[3], now_us)
        b = { key = key, t = tokens, rate = r[2], burst = r[3] }
        buckets[name] = b
        parked[name] = redis.call('EXISTS', base .. 'rparked:' .. name) == 1
      end
      if b.t >= 1 and (i <= restored or not parked[name]) then
        b.t = b.t - 1
        kept[#kept + 1] = envelope
        if slots then
          held[slots] = held[slots] + 1
          slotted[#kept] = slots
        end
      else
        redis.call('LPUSH', base .. 'rparked:' .. name, envelope)
        any_parked = true
        if not parked[name] then
          parked[name] = true
          local due = math.floor(now_us / 1000) + math.max(1, math.ceil((1 - b.t) * 1000 / b.rate))
          redis.call('ZADD', base .. 'rparkedops', 'NX', due, name)
          redis.call('HSET', base .. 'rparkedspec', name, string.format('%s %s', b.rate, b.burst))
        end
      end
    else
      kept[#kept + 1] = envelope
      if slots then
        held[slots] = held[slots] + 1
        slotted[#kept] = slots
      end
    end
  end
  for j = #batch, at, -1 do -- not looked at: back to the head, the first one claimed next
    push_pending(pending, batch[j], true)
  end
  for _, b in pairs(buckets) do
    redis.call('HSET', b.key, 't', string.format('%.6f', b.t), 'at', string.format('%d', now_us))
    -- a bucket left alone refills to full: once it would have, the key is not needed
    redis.call('PEXPIRE', b.key, math.ceil(b.burst * 1000 / b.rate) + 1000)
  end
  return kept, rate_wait(base, math.floor(now_us / 1000)), slotted, extra, capped
end
