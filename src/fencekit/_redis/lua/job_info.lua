-- Read a task's record and, while it is unfinished, find whether a consumer
-- runs it (its record is not written at claim: the in-flight hashes say).
-- Read-only.
--
-- KEYS[1]  record      P:{Q}:job:<jid>
-- KEYS[2..] inflight   P:{Q}:inflight:<consumer> of every registered consumer of Q
-- ARGV[1]  jid
--
-- Reply: { fields, token, envelope }
--   fields    the record as HGETALL returns it ({} when there is none)
--   token     the running delivery's token, 0 when none runs it
--   envelope  the running delivery's envelope, "" when none
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then
  return { fields, 0, '' }
end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'pending' or state == 'scheduled' then
  local needle = '{"jid":"' .. ARGV[1] .. '"'
  for i = 2, #KEYS do
    local entries = redis.call('HGETALL', KEYS[i])
    for j = 1, #entries, 2 do
      if string.sub(entries[j + 1], 1, #needle) == needle then
        return { fields, entries[j], entries[j + 1] }
      end
    end
  end
end
return { fields, 0, '' }
