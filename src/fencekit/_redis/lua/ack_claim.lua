-- The hot path: acknowledge finished deliveries and claim new ones in one
-- atomic step. A claimed task moves from the queue into this consumer's
-- in-flight hash under a fresh fencing token (I1, I2 of docs/design.md); an ack counts
-- only if that token is still this consumer's current delivery (I3), and only
-- then does a recorded task's result land in its record.
--
-- KEYS[1]  pending     P:{Q}:pending  (and its priority lists, _prio.lua)
-- KEYS[2]  inflight    P:{Q}:inflight:<consumer>  HASH token -> envelope
-- KEYS[3]  token       P:{Q}:token                last token issued for Q
-- KEYS[4]  stats       P:{Q}:stats                ("processed", "fenced_out")
-- KEYS[5]  wake        P:{Q}:wake
-- KEYS[6]  finished    P:{Q}:finished             (only with recorded acks)
-- KEYS[7..6+r] records P:{Q}:job:<jid>            one per recorded ack, in order
-- then, only with staged writes, two per write (the last 2w keys):
--   its job's fence P:fence:{Q}:job:<jid>, its target key (the queue's hash tag)
-- ARGV[1]  how many tasks to claim (0: only acknowledge); for a queue with
--          rate-limited or concurrency-keyed workers "<n> <spec JSON>"
--          (_flow.lua, _slots.lua), which adds the wait to the reply; with
--          concurrency keys an ack also gives its delivery's slot back
-- ARGV[2]  p: how many plain acks follow; "<p> <w>" when w staged writes ride
--          the acks (current_job().set_on_ack): their token, value pairs are
--          the last 2w of ARGV. A write lands only if its delivery's ack is
--          accepted here and the delivery is not older than its job's fence
--          (the rule of _job_write.lua); a delivery below its fence is refused
--          whole (fenced, nothing of it written, its in-flight entry dropped)
-- ARGV[3..2+p] tokens of finished deliveries to acknowledge (no record)
-- then, only with recorded acks:
--   ARGV[3+p]  the done channel P:{Q}:done (one SPUBLISH of the recorded jids,
--              space-separated)
--   ARGV[4+p]  how many finished records the queue keeps
--   then 7 per recorded ack: token, jid, result (JSON), retention ms,
--   envelope ("" when the record exists already), unique key ("" for none),
--   and its extra: "" for none (the default), else the batch id (a batch child
--   leaves its note "<bid> <jid> s" on P:{Q}:notes, derived from KEYS[4], as it
--   becomes final; _note.lua), after a "!" when the task checkpointed (its
--   state P:{Q}:state:<jid> is kept with its record, _ckpt.lua)
--
-- Reply: { fenced, first, lost, env_1, ..., env_n }, or with a spec
--        { fenced, first, lost, wait, env_1, ..., env_n }
--   fenced  array of the acknowledged tokens that were refused (reaped or
--           returned meanwhile: counted as fenced_out, not processed)
--   first   token of env_1 (env_i holds first + i - 1), 0 when none claimed
--   lost    1 when tokens were refused and the queue's token counter is gone
--           too: Redis lost its data since they were claimed (nothing was
--           fenced, nothing is counted), else 0
--   wait    ms until the earliest operation parked for a token has one again
--           (0: none parked); the consumer should look at this queue again then
--           (the queue's other tasks are claimed meanwhile: no head of line)
--!include _clock.lua
--!include _next_token.lua
--!include _wake.lua
--!include _now_ms.lua
--!include _record.lua
--!include _env.lua
-- The priority and flow helpers are built only when used (a call that needs
-- neither -- the default path -- creates none of their closures).
local function flow_helpers()
--!include _prio.lua
--!include _slots.lua
--!include _flow.lua
  return { pop = pop_pending, filter = flow_filter, base = queue_base, release = release_slot,
    restore = rate_restore, wait = rate_wait }
end
local flow = nil
local want = tonumber(ARGV[1])
local spec = nil
if not want then
  local sep = string.find(ARGV[1], ' ', 1, true)
  want = tonumber(string.sub(ARGV[1], 1, sep - 1))
  spec = cjson.decode(string.sub(ARGV[1], sep + 1))
  flow = flow_helpers()
end
-- with concurrency keys, an ack reads the envelope first to give its slot back
local slotted = spec and spec.c and flow.base(KEYS[1])
local function settled(token)
  local envelope = redis.call('HGET', KEYS[2], token)
  if not envelope then
    return false
  end
  redis.call('HDEL', KEYS[2], token)
  flow.release(slotted, envelope, token)
  return true
end
local fenced = {}
local acked = 0
local plain = tonumber(ARGV[2])
local writes, nkeys, wargs = 0, #KEYS, #ARGV
local stale, accepted = nil, nil -- only with staged writes
if not plain then
  local sep = string.find(ARGV[2], ' ', 1, true)
  plain = tonumber(string.sub(ARGV[2], 1, sep - 1))
  writes = tonumber(string.sub(ARGV[2], sep + 1))
  nkeys, wargs = #KEYS - 2 * writes, #ARGV - 2 * writes
  stale, accepted = {}, {}
  for i = 1, writes do
    local token = ARGV[wargs + 2 * i - 1]
    if tonumber(token) < tonumber(redis.call('GET', KEYS[nkeys + 2 * i - 1]) or '0') then
      stale[token] = true
    end
  end
end
-- with staged writes: a delivery below its fence is refused; an accepted one may write
local function passes(token, ok)
  if ok and stale then
    if stale[token] then
      return false
    end
    accepted[token] = true
  end
  return ok
end
if slotted then
  for i = 3, 2 + plain do
    if passes(ARGV[i], settled(ARGV[i])) then
      acked = acked + 1
    else
      fenced[#fenced + 1] = ARGV[i]
    end
  end
elseif stale then
  for i = 3, 2 + plain do
    if passes(ARGV[i], redis.call('HDEL', KEYS[2], ARGV[i]) == 1) then
      acked = acked + 1
    else
      fenced[#fenced + 1] = ARGV[i]
    end
  end
else -- the default path, as before
  for i = 3, 2 + plain do
    if redis.call('HDEL', KEYS[2], ARGV[i]) == 1 then
      acked = acked + 1
    else
      fenced[#fenced + 1] = ARGV[i]
    end
  end
end
if nkeys > 6 then
  local channel = ARGV[3 + plain]
  local cap = tonumber(ARGV[4 + plain])
  local now = string.format('%d', now_ms())  -- formatted once, not by each HSET
  local by = string.match(KEYS[2], ':inflight:(.+)$') or '-'  -- the consumer: the job page's last run
  local index = {}
  local jids = {}
  for r = 1, nkeys - 6 do
    local at = 4 + plain + (r - 1) * 7
    local token = ARGV[at + 1]
    if passes(token, (slotted and settled(token)) or (not slotted and redis.call('HDEL', KEYS[2], token) == 1)) then
      acked = acked + 1
      local record = KEYS[6 + r]
      if ARGV[at + 5] == '' then
        redis.call('HSET', record, 'state', 'done', 'result', ARGV[at + 3], 'finished', now, 'token', token,
          'by', by)
      else
        write_env(record, ARGV[at + 5], { 'state', 'done', 'result', ARGV[at + 3], 'finished', now, 'token', token,
          'by', by })
      end
      redis.call('PEXPIRE', record, ARGV[at + 4])
      if ARGV[at + 6] ~= '' then
        expire_unique(ARGV[at + 6], tonumber(ARGV[at + 4]))
      end
      local extra = ARGV[at + 7]
      if extra ~= '' then
        if string.byte(extra, 1) == 33 then -- "!": the state goes with the record
          redis.call('PEXPIRE', string.sub(KEYS[4], 1, -6) .. 'state:' .. ARGV[at + 2], ARGV[at + 4])
          extra = string.sub(extra, 2)
        end
        if extra ~= '' then
          redis.call('LPUSH', string.sub(KEYS[4], 1, -6) .. 'notes', extra .. ' ' .. ARGV[at + 2] .. ' s')
        end
      end
      index[#index + 1] = record
      jids[#jids + 1] = ARGV[at + 2]
    else
      fenced[#fenced + 1] = token
    end
  end
  if #jids > 0 then
    redis.call('LPUSH', KEYS[6], unpack(index))
    redis.call('SPUBLISH', channel, table.concat(jids, ' '))
    trim_records(KEYS[6], cap)
  end
end
for i = 1, writes do -- in the order the jobs staged them
  if accepted[ARGV[wargs + 2 * i - 1]] then
    redis.call('SET', KEYS[nkeys + 2 * i], ARGV[wargs + 2 * i])
  end
end
if acked > 0 then
  redis.call('HINCRBY', KEYS[4], 'processed', acked)
end
local lost = 0
if #fenced > 0 then
  if redis.call('EXISTS', KEYS[3]) == 0 then
    lost = 1
  else
    redis.call('HINCRBY', KEYS[4], 'fenced_out', #fenced)
  end
end
local reply = { fenced, 0, lost }
local base = 3
if spec then
  reply[4] = 0
  base = 4
end
if want > 0 then
  local items
  local restored = nil -- the default path builds no table here
  local n_restored = 0
  if spec and spec.r then -- tasks parked for a token that is due now go first (_flow.lua)
    restored = flow.restore(string.sub(KEYS[1], 1, #KEYS[1] - #'pending'), want)
    n_restored = #restored
  end
  if n_restored >= want then
    items = false
  elseif redis.call('EXISTS', KEYS[1] .. ':prio') == 0 then -- no priority list in use (lua/_prio.lua)
    items = redis.call('RPOP', KEYS[1], want - n_restored)
  else
    flow = flow or flow_helpers()
    items = flow.pop(KEYS[1], want - n_restored, spec and spec.w)
  end
  if n_restored > 0 then
    for _, envelope in ipairs(items or {}) do
      restored[#restored + 1] = envelope
    end
    items = restored
  end
  local popped = 0
  local slots = nil
  if items then
    popped = #items
    if spec then
      local function more(n)
        if redis.call('EXISTS', KEYS[1] .. ':prio') == 0 then
          return redis.call('RPOP', KEYS[1], n)
        end
        return flow.pop(KEYS[1], n, spec.w)
      end
      local extra, capped
      items, reply[4], slots, extra, capped = flow.filter(KEYS[1], items, spec, n_restored, want, more)
      popped = popped + extra
      if capped then -- stopped parking a long run of one operation's tasks: a claim goes on soon
        wake(KEYS[5])
      end
    end
  elseif spec and spec.r then -- nothing to claim: when do the parked ones have a token?
    reply[4] = flow.wait(string.sub(KEYS[1], 1, #KEYS[1] - #'pending'), now_ms())
  end
  if items and #items > 0 then
    local first = next_tokens(KEYS[3], #items)
    local fields = {}
    for i, envelope in ipairs(items) do
      fields[2 * i - 1] = string.format('%d', first + i - 1)
      fields[2 * i] = envelope
      reply[i + base] = envelope
    end
    redis.call('HSET', KEYS[2], unpack(fields))
    if slots then
      for i, key in pairs(slots) do
        redis.call('SADD', key, string.format('%d', first + i - 1))
      end
    end
    reply[2] = first
    if popped >= want and (redis.call('LLEN', KEYS[1]) > 0 or redis.call('EXISTS', KEYS[1] .. ':prio') == 1) then
      wake(KEYS[5])
    end
  end
end
return reply
