-- Include-only helpers for task records (P:{Q}:job:<jid>, a HASH).
--
-- expire_unique: a unique key (enqueue_unique.lua) dedupes no longer than
-- its holder's record lives.
-- finish_record: write a finished task's fields, give the record its
-- retention (keep_ms > 0: PEXPIRE; 0: kept until trimmed) and add it to
-- index (a ZSET of record keys by finish time); the unique key it holds, if
-- any, expires with it at the latest.
-- trim_records: drop the oldest records of index beyond cap. The keys it
-- drops come from the index, so they share its hash tag (the queue's): every
-- script that includes this stays single-slot.
local function expire_unique(unique, ttl)
  local left = redis.call('PTTL', unique)
  if left == -1 or left > ttl then
    redis.call('PEXPIRE', unique, ttl)
  end
end

local function finish_record(record, index, fields, keep_ms, now)
  redis.call('HSET', record, unpack(fields))
  if keep_ms > 0 then
    redis.call('PEXPIRE', record, keep_ms)
  else
    redis.call('PERSIST', record)
  end
  redis.call('ZADD', index, now, record)
  local unique = redis.call('HGET', record, 'unique')
  if unique then
    local ttl = keep_ms
    if ttl <= 0 then
      ttl = tonumber(redis.call('HGET', record, 'keep') or '1')
    end
    expire_unique(unique, ttl)
  end
end

local function trim_records(index, cap)
  local excess = redis.call('ZCARD', index) - cap
  while excess > 0 do
    local old = redis.call('ZPOPMIN', index, math.min(excess, 1000))
    if #old == 0 then
      break
    end
    local doomed = {}
    for i = 1, #old, 2 do
      doomed[#doomed + 1] = old[i]
    end
    redis.call('DEL', unpack(doomed))
    excess = excess - #doomed
  end
end
