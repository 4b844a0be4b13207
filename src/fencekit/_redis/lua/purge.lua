-- Drop every task waiting in a queue (not scheduled, not in flight), and the
-- records (and unique keys) of those that kept one.
--
-- KEYS[1]  pending     P:{Q}:pending     (and its priority lists, _prio.lua)
-- KEYS[2]  stats       P:{Q}:stats       ("purged" += n, so counters still add up)
-- ARGV[1]  the record key prefix P:{Q}:job: (a record key is it + the jid, so it
--          shares the queue's hash tag)
--
-- A batch child leaves its note "<bid> <jid> c" on P:{Q}:notes (_note.lua).
--
-- Reply: the number of tasks dropped.
--!include _prio.lua
--!include _note.lua
--!include _ckpt.lua
--!include _record.lua
local total = 0
for _, list in ipairs(waiting_lists(KEYS[1])) do
local n = redis.call('LLEN', list)
total = total + n
if n > 0 then
  local batch = 10000
  for start = 0, n - 1, batch do
    local items = redis.call('LRANGE', list, start, start + batch - 1)
    for _, envelope in ipairs(items) do
      note_final(KEYS[2], envelope, 'c')
      drop_state(KEYS[2], envelope)
      local jid = string.match(envelope, '^{"jid":"([^"\\]+)"')
      if jid and string.find(envelope, '"keep":', 1, true) then
        local unique = record_unique(ARGV[1] .. jid, string.sub(ARGV[1], 1, #ARGV[1] - #'job:'))
        if unique and redis.call('GET', unique) == jid then
          redis.call('DEL', unique)
        end
        redis.call('DEL', ARGV[1] .. jid)
      end
    end
  end
  redis.call('DEL', list)
end
end
local base = string.sub(KEYS[1], 1, #KEYS[1] - #'pending')
for _, l in ipairs(prio_levels(KEYS[1])) do
  if l.fair then
    redis.call('DEL', fair_base(KEYS[1]) .. 'ring:' .. l.p, fair_base(KEYS[1]) .. 'turn:' .. l.p)
  end
end
redis.call('DEL', fair_base(KEYS[1]) .. 'len')
redis.call('DEL', prio_marker(KEYS[1]), base .. 'parkedkeys', base .. 'rparkedops', base .. 'rparkedspec')
if total > 0 then
  redis.call('HINCRBY', KEYS[2], 'purged', total)
end
return total
