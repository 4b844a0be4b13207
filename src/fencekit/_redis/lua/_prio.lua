-- Priorities (docs/guides/flow.md): a task of the default priority 0 lives on the
-- queue's pending list as always; a task of priority p ~= 0 (-5..5) carries
-- "priority":p right after its jid and lives on its own list
-- P:{Q}:pending:<p>; the ZSET P:{Q}:pending:prio (member and score p) marks
-- which of those lists may be non-empty. A marker whose list is empty is
-- harmless (the next claim removes it); a non-empty list always has its
-- marker (every push adds it). All derived from the pending key: one hash tag.
local function prio_of(envelope)
  local p = string.match(envelope, '^{"jid":"[^"]*","priority":(%-?%d+)')
  if p then
    return tonumber(p)
  end
  return 0
end
local function prio_marker(pending)
  return pending .. ':prio'
end
local function prio_list(pending, p)
  if p == 0 then
    return pending
  end
  return pending .. ':' .. p
end
-- Push one envelope onto its priority's list: the tail (LPUSH, claimed last)
-- or, with head true, the head (RPUSH, claimed next).
local function push_pending(pending, envelope, head)
  local p = prio_of(envelope)
  local key = pending
  if p ~= 0 then
    key = pending .. ':' .. p
    redis.call('ZADD', pending .. ':prio', p, p)
  end
  if head then
    redis.call('RPUSH', key, envelope)
  else
    redis.call('LPUSH', key, envelope)
  end
end
-- Every pending list of the queue, highest priority first (the default list
-- in its place among them).
local function pending_lists(pending)
  local lists = {}
  local placed = false
  for _, m in ipairs(redis.call('ZREVRANGE', pending .. ':prio', 0, -1)) do
    local p = tonumber(m)
    if p < 0 and not placed then
      lists[#lists + 1] = pending
      placed = true
    end
    lists[#lists + 1] = pending .. ':' .. m
  end
  if not placed then
    lists[#lists + 1] = pending
  end
  return lists
end
-- The lists of parked tasks: by a full concurrency key (_slots.lua; the SET
-- P:{Q}:parkedkeys names them) and by a rate limit without a token (_flow.lua;
-- the ZSET P:{Q}:rparkedops names them). Not claimable until a slot is given
-- back or a token comes, but waiting all the same, so every reader counts them.
local function parked_lists(pending)
  local base = string.sub(pending, 1, #pending - #'pending')
  local lists = {}
  for _, key in ipairs(redis.call('SMEMBERS', base .. 'parkedkeys')) do
    lists[#lists + 1] = base .. 'parked:' .. key
  end
  for _, op in ipairs(redis.call('ZRANGE', base .. 'rparkedops', 0, -1)) do
    lists[#lists + 1] = base .. 'rparked:' .. op
  end
  return lists
end
-- Every list a waiting task may be on, in claim order, the parked ones last.
local function waiting_lists(pending)
  local lists = pending_lists(pending)
  for _, key in ipairs(parked_lists(pending)) do
    lists[#lists + 1] = key
  end
  return lists
end
-- How many tasks wait on all the lists (parked ones included).
local function pending_len(pending)
  local base = string.sub(pending, 1, #pending - #'pending')
  if redis.call('EXISTS', pending .. ':prio', base .. 'parkedkeys', base .. 'rparkedops') == 0 then
    return redis.call('LLEN', pending)
  end
  local n = 0
  for _, key in ipairs(waiting_lists(pending)) do
    n = n + redis.call('LLEN', key)
  end
  return n
end
-- Pop up to want envelopes, highest priority first, FIFO within one; a
-- priority list found emptied loses its marker.
local function pop_pending(pending, want)
  if redis.call('EXISTS', pending .. ':prio') == 0 then
    return redis.call('RPOP', pending, want)
  end
  local items = {}
  for _, key in ipairs(pending_lists(pending)) do
    local ask = want - #items
    if ask <= 0 then
      break
    end
    local got = redis.call('RPOP', key, ask)
    local n = 0
    if got then
      n = #got
      for _, envelope in ipairs(got) do
        items[#items + 1] = envelope
      end
    end
    if n < ask and key ~= pending then
      redis.call('ZREM', pending .. ':prio', string.sub(key, #pending + 2))
    end
  end
  if #items == 0 then
    return false
  end
  return items
end
