-- Include-only helpers for task records (P:{Q}:job:<jid>, a HASH).
--
-- An index (P:{Q}:finished, P:{Q}:failed) is a LIST of record keys, newest
-- first: LPUSH as a task finishes, the oldest popped from the tail. A record
-- that expired on its own leaves its key in the list until it is popped.
--
-- expire_unique: a unique key (enqueue_unique.lua) dedupes no longer than
-- its holder's record lives.
-- record_unique(record, base): the unique key (P:{Q}:unique:<key>) the
-- record's task holds, false for none; base is P:{Q}:. A record holds only
-- <key>, in "uk": the whole key name (~25 bytes more) in a field made most
-- records a hashtable, about twice the memory of a listpack. A record
-- written before holds the whole name in "unique"; it reads as it did.
-- finish_record: write a finished task's fields, give the record its
-- retention (keep_ms > 0: PEXPIRE; 0: kept until trimmed) and push it onto
-- index; the unique key it holds, if any, expires with it at the latest.
-- note_run: append one line "<token> <ended ms> <outcome> <consumer>" to the
-- record's runs field, the newest MAX_RUNS kept (the job page's attempts;
-- records.parse numbers them). The consumer is read from the in-flight key.
-- A run that completes the task writes no line (ack_claim.lua is the hot
-- path): its token, finished and by fields are that run.
-- trim_records: drop the oldest records of index beyond cap. The keys it
-- drops come from the index, so they share its hash tag (the queue's): every
-- script that includes this stays single-slot.
local function expire_unique(unique, ttl)
  local left = redis.call('PTTL', unique)
  if left == -1 or left > ttl then
    redis.call('PEXPIRE', unique, ttl)
  end
end

local function record_unique(record, base)
  local held = redis.call('HMGET', record, 'uk', 'unique')
  if held[1] then
    return base .. 'unique:' .. held[1]
  end
  return held[2]
end

local function finish_record(record, index, fields, keep_ms)
  redis.call('HSET', record, unpack(fields))
  if keep_ms > 0 then
    redis.call('PEXPIRE', record, keep_ms)
  else
    redis.call('PERSIST', record)
  end
  redis.call('LPUSH', index, record)
  local unique = record_unique(record, string.match(index, '^(.*:)[^:]*$'))
  if unique then
    local ttl = keep_ms
    if ttl <= 0 then
      ttl = tonumber(redis.call('HGET', record, 'keep') or '1')
    end
    expire_unique(unique, ttl)
  end
end

local MAX_RUNS = 50
local function note_run(record, token, ended, outcome, inflight)
  local consumer = string.match(inflight, ':inflight:(.+)$') or '-'
  local line = token .. ' ' .. ended .. ' ' .. outcome .. ' ' .. consumer
  local runs = redis.call('HGET', record, 'runs')
  if runs then
    local _, lines = string.gsub(runs, '\n', '')
    if lines + 1 >= MAX_RUNS then
      runs = string.match(runs, '^[^\n]*\n(.*)$')
    end
    line = runs .. '\n' .. line
  end
  redis.call('HSET', record, 'runs', line)
end

local function trim_records(index, cap)
  local excess = redis.call('LLEN', index) - cap
  while excess > 0 do
    local doomed = redis.call('RPOP', index, math.min(excess, 1000))
    if not doomed then
      break
    end
    redis.call('DEL', unpack(doomed))
    excess = excess - #doomed
  end
end
