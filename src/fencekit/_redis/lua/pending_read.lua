-- Read what waits in a queue across every priority list (Queue.length,
-- Queue.pending, the admin page's and the CLI's counts). Read-only.
--
-- KEYS[1]  pending     P:{Q}:pending     (and its priority lists, _prio.lua)
-- ARGV[1]  "len": only the count; "list": the envelopes too
--
-- Reply: { n, env_1, ..., env_n (only for "list") } in claim order (highest
--        priority first, FIFO within one; tasks parked by a full concurrency
--        key last)
--!include _prio.lua
if ARGV[1] == 'len' then
  return { pending_len(KEYS[1]) }
end
local reply = { 0 }
for _, list in ipairs(waiting_lists(KEYS[1])) do
  local items = redis.call('LRANGE', list, 0, -1)
  for i = #items, 1, -1 do
    reply[#reply + 1] = items[i]
  end
end
reply[1] = #reply - 1
return reply
