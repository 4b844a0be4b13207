-- Book what happened on one queue since the previous sample (by any host)
-- into its per-minute and per-hour history buckets, and drop the buckets that
-- fell out of each tier's window.
--
-- A bucket is one HASH field: the bucket number (time / step) -> 22 integers,
-- space-separated: processed failed retried fenced_out dead depth dur_sum_us
-- and the 15 duration-histogram counts (jobs/histogram.py's buckets, +Inf
-- last). Counters are booked as the difference between the queue's counters
-- now and those the previous sample saw (kept in KEYS[3]), so any number of
-- hosts may sample the same queue: each increment is booked once. Durations
-- are per host (its own jobs since its own previous sample), so they add up.
-- Depth is the largest pending length seen in the bucket.
--
-- KEYS[1]  stats     P:{Q}:stats
-- KEYS[2]  pending   P:{Q}:pending
-- KEYS[3]  last      P:{Q}:history:last  HASH: the counters seen by the previous
--                                        sample, and per tier the newest bucket written
-- KEYS[4]  minutes   P:{Q}:history:m     HASH: bucket -> values, step ARGV[3]
-- KEYS[5]  hours     P:{Q}:history:h     HASH: bucket -> values, step ARGV[5]
-- ARGV[1]  the sample's time in ms; "" = the Redis clock
-- ARGV[2]  ms to book back in time (a sample just after a minute mark books
--          into the minute that ended)
-- ARGV[3]  minute tier: step in seconds    ARGV[4]  its number of buckets kept
-- ARGV[5]  hour tier: step in seconds      ARGV[6]  its number of buckets kept
-- ARGV[7]  this host's durations since its previous sample: "" or 16 integers,
--          "sum_us c1 ... c15" (anything else: no durations booked)
--
-- Reply: {processed booked, depth}.
--!include _now_ms.lua
--!include _prio.lua
local COUNTERS = {'processed', 'failed', 'retried', 'fenced_out', 'dead'}
local WIDTH = 22

local now = tonumber(ARGV[1]) or now_ms()
local at = now - tonumber(ARGV[2])

local current = redis.call('HMGET', KEYS[1], unpack(COUNTERS))
local seen = redis.call('HMGET', KEYS[3], 'processed', 'failed', 'retried', 'fenced_out', 'dead', 'm', 'h')
local add = {}
local booked = false
local changed = false -- anything to write back into KEYS[3]
local fresh = {}
for i = 1, #COUNTERS do
  local c = tonumber(current[i]) or 0
  local s = tonumber(seen[i])
  local d = 0
  if s then
    -- counters only grow; a smaller value means they were reset (Redis lost its data)
    if c >= s then d = c - s else d = c end
  end
  add[i] = d
  if d > 0 then booked = true end
  if c ~= s then changed = true end
  fresh[#fresh + 1] = COUNTERS[i]
  fresh[#fresh + 1] = c
end

local depth = pending_len(KEYS[2])
local durations = {}
if ARGV[7] ~= '' then
  for n in string.gmatch(ARGV[7], '%d+') do
    durations[#durations + 1] = tonumber(n)
  end
  if #durations ~= WIDTH - 6 then
    durations = {} -- not what scripts.history_sample builds: book the counters only
  end
  for i = 2, #durations do
    if durations[i] > 0 then booked = true end
  end
end

-- Book into tier `key` (buckets of step_s seconds, `keep` of them, newest so far `newest`);
-- returns the newest bucket after this sample.
local function book(key, step_s, keep, newest)
  local bucket = math.floor(at / (step_s * 1000))
  if newest and bucket > newest then
    if bucket - newest >= keep then
      redis.call('DEL', key)
    else
      for old = newest - keep + 1, bucket - keep do
        redis.call('HDEL', key, old)
      end
    end
  end
  if newest and bucket <= newest - keep then
    return newest -- a clock behind by more than the window: nothing to book into
  end
  if booked or depth > 0 then
    local values = {}
    local old = redis.call('HGET', key, bucket)
    if old then
      for n in string.gmatch(old, '%d+') do
        values[#values + 1] = tonumber(n)
      end
    end
    for i = #values + 1, WIDTH do
      values[i] = 0
    end
    for i = 1, #COUNTERS do
      values[i] = values[i] + add[i]
    end
    if depth > values[6] then values[6] = depth end
    for i = 1, #durations do
      values[6 + i] = values[6 + i] + durations[i]
    end
    for i = 1, WIDTH do
      values[i] = string.format('%d', values[i])
    end
    redis.call('HSET', key, bucket, table.concat(values, ' '))
  end
  if newest and newest > bucket then return newest end
  return bucket
end

local minute = book(KEYS[4], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(seen[6]))
local hour = book(KEYS[5], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(seen[7]))
if changed or minute ~= tonumber(seen[6]) or hour ~= tonumber(seen[7]) then
  fresh[#fresh + 1] = 'm'
  fresh[#fresh + 1] = minute
  fresh[#fresh + 1] = 'h'
  fresh[#fresh + 1] = hour
  redis.call('HSET', KEYS[3], unpack(fresh))
end
return {add[1], depth}
