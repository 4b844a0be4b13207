-- The Redis ceiling of one kind of job: replays the commands the drain sends
-- Redis for a batch of jobs, batched as the drain batches them, inside one
-- script (no network, no protocol, no client). bench/ceiling.py times it from
-- INFO commandstats and compares each drain with it.
--
-- KEYS[1]  pending   {bench}:pending    LIST, filled with envelopes beforehand
-- KEYS[2]  inflight  {bench}:inflight   HASH token -> envelope
-- KEYS[3]  finished  {bench}:finished   LIST of record keys, newest first
-- KEYS[4]  fence     {bench}:fence      the job fence a fenced write reads
-- ARGV[1]  jobs in the batch (claimed with one RPOP)
-- ARGV[2]  first token of the batch
-- ARGV[3]  what each job does beside its claim and ack: "" (nothing kept),
--          "r" (its record: outcome HSET, PEXPIRE, index entry, trimmed to
--          ARGV[4]), "f" (one fenced write), "fr" (both), "a" (one write
--          riding the ack: its fence read and its SET in the ack), "ar" (both)
-- ARGV[4]  records kept (keep_finished)
-- ARGV[5]  the result each record holds ("null" for a no-op)
--
-- Reply: how many jobs were replayed (fewer when pending ran short).
local n, first, kind = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local record = string.find(kind, 'r', 1, true)
local fenced = string.find(kind, 'f', 1, true)
local on_ack = string.find(kind, 'a', 1, true)
local items = redis.call('RPOP', KEYS[1], n)
if not items then
  return 0
end
local fields, tokens = {}, {}
for i, envelope in ipairs(items) do
  local token = string.format('%d', first + i - 1)
  fields[2 * i - 1], fields[2 * i] = token, envelope
  tokens[i] = token
end
redis.call('HSET', KEYS[2], unpack(fields))
if fenced then -- each job's set_if_fresh (job_set_many.lua: _job_write.lua per write)
  for _, token in ipairs(tokens) do
    if redis.call('HEXISTS', KEYS[2], token) == 1 and tonumber(token) >= tonumber(redis.call('GET', KEYS[4]) or '0') then
      redis.call('SET', '{bench}:out:' .. (tonumber(token) % 1024), token)
    end
  end
end
local now = string.format('%d', redis.call('TIME')[1] * 1000)
local index = {}
for i, token in ipairs(tokens) do
  if on_ack then -- ack_claim.lua: the job's fence read before the acks, the SET after
    redis.call('GET', KEYS[4])
  end
  redis.call('HDEL', KEYS[2], token)
  if on_ack then
    redis.call('SET', '{bench}:out:' .. (tonumber(token) % 1024), token)
  end
  if record then
    local key = '{bench}:job:' .. token
    redis.call('HSET', key, 'state', 'done', 'result', ARGV[5], 'finished', now, 'token', token, 'by', 'c1')
    redis.call('PEXPIRE', key, 3600000)
    index[i] = key
  end
end
if record then
  redis.call('LPUSH', KEYS[3], unpack(index))
  local excess = redis.call('LLEN', KEYS[3]) - tonumber(ARGV[4])
  if excess > 0 then
    redis.call('DEL', unpack(redis.call('RPOP', KEYS[3], excess)))
  end
end
redis.call('HINCRBY', '{bench}:stats', 'processed', #items)
return #items
