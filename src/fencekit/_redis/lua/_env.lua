-- Include-only helpers for the envelope a task record holds (P:{Q}:job:<jid>).
--
-- The envelope is split over fields of at most ENV_CHUNK bytes: "env" holds
-- its start, "env1", "env2", ... the rest, in order, each cut at a UTF-8
-- character's boundary. Redis keeps a hash whose values all fit in
-- hash-max-listpack-value bytes (64 by default) as one compact listpack; a
-- ~150-byte envelope in one field made every record a hashtable: about 1.5
-- times the memory, slower to write and to delete. Readers join "env",
-- "env1", ... up to the first field missing, so a record written before the
-- split (the whole envelope in "env") reads as it did.
--
-- env_fields(envelope, fields): append the envelope's field/value pairs to
--   fields (a table of HSET arguments); returns fields and how many chunks.
-- drop_env_tail(record, chunks): drop the chunks "env<chunks>", ... that a
--   longer envelope left behind (a record written again).
-- write_env(record, envelope, fields, fresh): HSET fields and the envelope's
--   fields in one call; unless fresh (the record was just deleted), then
--   drop_env_tail.
-- record_env(record): the record's envelope, or false when it has none.
local ENV_CHUNK = 64

local function env_fields(envelope, fields)
  local n, at, i = #fields, 1, 0
  repeat
    local stop = at + ENV_CHUNK - 1
    local after = string.byte(envelope, stop + 1)
    while after and after >= 128 and after < 192 and stop > at do -- not inside a character
      stop = stop - 1
      after = string.byte(envelope, stop + 1)
    end
    fields[n + 1] = (i == 0) and 'env' or ('env' .. i)
    fields[n + 2] = string.sub(envelope, at, stop)
    n, at, i = n + 2, stop + 1, i + 1
  until at > #envelope
  return fields, i
end

local function drop_env_tail(record, chunks)
  local i = chunks
  while redis.call('HDEL', record, 'env' .. i) == 1 do
    i = i + 1
  end
end

local function write_env(record, envelope, fields, fresh)
  local chunks
  fields, chunks = env_fields(envelope, fields)
  redis.call('HSET', record, unpack(fields))
  if not fresh then
    drop_env_tail(record, chunks)
  end
end

local function record_env(record)
  local head = redis.call('HGET', record, 'env')
  if not head then
    return false
  end
  local parts, i = { head }, 1
  while true do
    local part = redis.call('HGET', record, 'env' .. i)
    if not part then
      return table.concat(parts)
    end
    parts[i + 1] = part
    i = i + 1
  end
end
