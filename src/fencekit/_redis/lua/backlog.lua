-- The scaling signal of one queue (fencekit.services.backlog): how much work waits
-- and for how long. Read-only; every key shares the queue's hash tag.
--
-- KEYS[1]  pending     P:{Q}:pending     LIST (and its priority and parked lists)
-- KEYS[2]  scheduled   P:{Q}:scheduled   ZSET scored by due time (ms)
--
-- Reply: { pending, due, oldest_ms, now_ms, parked, ops, fair }
--   pending    the tasks on every pending list (priorities and parked ones included)
--   due        the scheduled tasks whose time has come (the scheduler moves them next)
--   oldest_ms  enqueued_at of the oldest task next to be claimed on any pending list
--              (parked ones aside: they cannot run now; ms, as text), "" when none
--   now_ms     the Redis clock (ms), which the oldest task's age is measured against
--   parked     of pending, the tasks parked for a concurrency slot or a rate token
--   ops        per operation with tasks parked for a token: op, count, ms its token is due
--              (op is "<operation>\31<key>" for a key of a per-key rate limit)
--   fair       { keys, key_1, count_1, ... }: how many fair-share keys have work (over
--              every priority), then the next FAIR_SHOWN of them in turn order with
--              how many tasks each has waiting (at its priority)
--!include _prio.lua
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local FAIR_SHOWN = 50 -- keys listed (and looked at for the oldest task): no scan over 10,000 keys
local heads = {}
local fair = { 0 }
for _, l in ipairs(prio_levels(KEYS[1])) do
  heads[#heads + 1] = l.list
  if l.fair then
    local ring = fair_base(KEYS[1]) .. 'ring:' .. l.p
    fair[1] = fair[1] + redis.call('LLEN', ring) - 1 -- "" (the keyless tasks' turn) aside
    local next_keys = redis.call('LRANGE', ring, -FAIR_SHOWN, -1)
    for i = #next_keys, 1, -1 do
      local key = next_keys[i]
      if key ~= '' and #fair < 1 + 2 * FAIR_SHOWN then
        local list = fair_base(KEYS[1]) .. ':' .. l.p .. ':' .. key
        heads[#heads + 1] = list
        fair[#fair + 1] = key
        fair[#fair + 1] = redis.call('LLEN', list)
      end
    end
  end
end
local oldest = nil
for _, key in ipairs(heads) do
  local head = redis.call('LINDEX', key, -1)  -- the oldest of a list: claimed next (RPOP)
  if head then
    local at = tonumber(string.match(head, '.*"enqueued_at":(%d+)'))
    if at and (oldest == nil or at < oldest) then
      oldest = at
    end
  end
end
local due = redis.call('ZCOUNT', KEYS[2], '-inf', now_ms)
local parked = 0
for _, key in ipairs(parked_lists(KEYS[1])) do
  parked = parked + redis.call('LLEN', key)
end
local ops = {}
local base = string.sub(KEYS[1], 1, #KEYS[1] - #'pending')
local scored = redis.call('ZRANGE', base .. 'rparkedops', 0, -1, 'WITHSCORES')
for i = 1, #scored, 2 do
  ops[#ops + 1] = scored[i]
  ops[#ops + 1] = redis.call('LLEN', base .. 'rparked:' .. scored[i])
  ops[#ops + 1] = scored[i + 1]
end
return { pending_len(KEYS[1]), due, oldest and tostring(oldest) or '', now_ms, parked, ops, fair }
