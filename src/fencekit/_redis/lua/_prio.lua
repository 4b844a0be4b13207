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
-- Fair share (docs/guides/flow.md): a task whose envelope carries "fair":<key>
-- (its head, codec.py: after the jid, priority, ckey and batch it sets) lives on
-- P:{Q}:fair:<p>:<key> at its priority p, and the LIST P:{Q}:fairring:<p>
-- holds the keys of level p in their turn order (RPOP the next, LPUSH it back
-- while its list has work), plus "" for the level's tasks without a key: they
-- take their turn as one more key. A key with no work is not in the ring (a
-- list emptied by cancel leaves its key, dropped at its next turn), so a claim
-- costs the same over 1 or 10,000 keys. The member "f<p>" (score p) of the
-- priority marker P:{Q}:pending:prio says level p has a ring; P:{Q}:fairlen
-- counts the tasks on every key's list (readers need not visit 10,000 lists).
local function head_field(envelope, name)
  local _, at = string.find(envelope, '^{"jid":"[^"]*"')
  if not at then
    return nil
  end
  if string.byte(envelope, at + 3) == 113 then -- ',"queue"': no optional head field (most tasks)
    return nil
  end
  for _, f in ipairs({ 'priority', 'ckey', 'batch', 'fair', 'rkey' }) do
    if f == name then
      return string.match(envelope, '^,"' .. name .. '":"([^"]*)"', at + 1)
    end
    local _, e = string.find(envelope, f == 'priority' and '^,"priority":%-?%d+' or '^,"' .. f .. '":"[^"]*"', at + 1)
    if e then
      at = e
    end
  end
  return nil
end
local function fair_of(envelope)
  return head_field(envelope, 'fair')
end
-- LPUSH (the tail: popped last) or, with head, RPUSH (popped next); the new length.
local function push_end(key, value, head)
  if head then
    return redis.call('RPUSH', key, value)
  end
  return redis.call('LPUSH', key, value)
end
local function fair_base(pending)
  return string.sub(pending, 1, #pending - #'pending') .. 'fair'
end
-- Push onto key's list of level p; a key that had no work joins the ring (at
-- its end, or next with head), the ring and its marker made if need be.
local function push_fair(pending, p, key, envelope, head)
  local base = fair_base(pending)
  local list = base .. ':' .. p .. ':' .. key
  local n = push_end(list, envelope, head)
  redis.call('INCR', base .. 'len')
  if n == 1 then
    local ring = base .. 'ring:' .. p
    if redis.call('EXISTS', ring) == 0 then
      redis.call('LPUSH', ring, '')
      redis.call('ZADD', pending .. ':prio', p, 'f' .. p)
    end
    push_end(ring, key, head)
  end
end
-- Call after taking n tasks off list by other means than a claim (cancel).
local function fair_taken(pending, list, n)
  local base = fair_base(pending)
  if n > 0 and string.sub(list, 1, #base + 1) == base .. ':' then
    redis.call('DECRBY', base .. 'len', n)
  end
end
-- The list a waiting envelope lives on: its priority's, or its fair key's.
local function home_list(pending, envelope)
  local fair = fair_of(envelope)
  if fair then
    return fair_base(pending) .. ':' .. prio_of(envelope) .. ':' .. fair
  end
  return prio_list(pending, prio_of(envelope))
end
-- Push one envelope onto its priority's list (or its fair key's): the tail
-- (LPUSH, claimed last) or, with head true, the head (RPUSH, claimed next).
local function push_pending(pending, envelope, head)
  local p = prio_of(envelope)
  local fair = fair_of(envelope)
  if fair then
    push_fair(pending, p, fair, envelope, head)
    return
  end
  local key = pending
  if p ~= 0 then
    key = pending .. ':' .. p
    redis.call('ZADD', pending .. ':prio', p, p)
  end
  push_end(key, envelope, head)
end
-- The levels in use, highest priority first, each { p, list (its plain
-- list), fair (it has a ring) }; the default level 0 always among them.
local function prio_levels(pending)
  local out, byp = {}, {}
  local function level(p)
    local l = byp[p]
    if not l then
      l = { p = p, list = prio_list(pending, p), fair = false }
      byp[p] = l
      out[#out + 1] = l
    end
    return l
  end
  for _, m in ipairs(redis.call('ZREVRANGE', pending .. ':prio', 0, -1)) do
    if string.byte(m, 1) == 102 then -- "f<p>"
      level(tonumber(string.sub(m, 2))).fair = true
    else
      level(tonumber(m))
    end
  end
  level(0)
  table.sort(out, function(a, b)
    return a.p > b.p
  end)
  return out
end
-- The lists of level p's keys in its ring (readers), each once.
local function fair_lists(pending, p)
  local base = fair_base(pending)
  local lists, seen = {}, {}
  for _, key in ipairs(redis.call('LRANGE', base .. 'ring:' .. p, 0, -1)) do
    if key ~= '' and not seen[key] then
      seen[key] = true
      lists[#lists + 1] = base .. ':' .. p .. ':' .. key
    end
  end
  return lists
end
-- Every pending list of the queue, highest priority first (the default list
-- in its place among them), a level's fair keys' lists after its plain one.
local function pending_lists(pending)
  if redis.call('EXISTS', pending .. ':prio') == 0 then
    return { pending }
  end
  local lists = {}
  for _, l in ipairs(prio_levels(pending)) do
    lists[#lists + 1] = l.list
    if l.fair then
      for _, key in ipairs(fair_lists(pending, l.p)) do
        lists[#lists + 1] = key
      end
    end
  end
  return lists
end
-- Claim up to want from level l's ring into items, a turn a key: one task a
-- turn, or with weights (key -> n, the claiming worker's fair_weights) n turns
-- in a row (P:{Q}:fairturn:<p> counts them across claims). A turn is one LMOVE
-- of the ring onto itself (the key goes to the end as it is served); a key
-- whose list ran dry leaves it. Returns true when the ring ended (no key has
-- work: the ring and its marker are gone, the level's plain list goes on).
local function pop_fair(pending, l, want, items, weights)
  local base = fair_base(pending)
  local ring = base .. 'ring:' .. l.p
  local turns = base .. 'turn:' .. l.p
  local got_n, steps, keyed, blank, since = 0, 0, 0, 0, 0
  local plain = redis.call('LLEN', l.list) > 0 -- only this claim pops the keyless tasks meanwhile
  local function done(ended)
    if keyed > 0 then
      redis.call('DECRBY', base .. 'len', keyed)
    end
    if ended then
      redis.call('DEL', ring, turns)
      redis.call('ZREM', pending .. ':prio', 'f' .. l.p)
    end
    return ended
  end
  while got_n < want and steps < 2 * want + 64 do
    steps = steps + 1
    local key = redis.call('LMOVE', ring, ring, 'RIGHT', 'LEFT')
    if not key then
      return done(true)
    end
    if key == '' then -- the keyless tasks' turn
      blank = blank + 1
      if blank > 1 and since == 0 and redis.call('LLEN', ring) <= 1 then
        return done(true) -- a whole round found no key with work
      end
      since = 0
      if plain then
        local got = redis.call('RPOP', l.list)
        if got then
          items[#items + 1] = got
          got_n = got_n + 1
        else
          plain = false
        end
      end
    else
      local list = base .. ':' .. l.p .. ':' .. key
      local got = redis.call('RPOP', list)
      local w = (weights and weights[key]) or 1
      if got then
        items[#items + 1] = got
        got_n = got_n + 1
        keyed = keyed + 1
        since = since + 1
      end
      if got and redis.call('EXISTS', list) == 1 then
        if w > 1 then
          if redis.call('HINCRBY', turns, key, 1) < w then
            redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT') -- its turn goes on
          else
            redis.call('HDEL', turns, key)
          end
        end
      else
        redis.call('LPOP', ring) -- no work left: out of the ring (the LMOVE put it there)
        if w > 1 then
          redis.call('HDEL', turns, key)
        end
        if redis.call('LLEN', ring) <= 1 then -- "" alone: no key has work
          return done(true)
        end
      end
    end
  end
  return done(false)
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
  local n = tonumber(redis.call('GET', fair_base(pending) .. 'len') or '0')
  for _, l in ipairs(prio_levels(pending)) do
    n = n + redis.call('LLEN', l.list)
  end
  for _, key in ipairs(parked_lists(pending)) do
    n = n + redis.call('LLEN', key)
  end
  return n
end
-- Pop up to want envelopes, highest priority first, FIFO within one (within
-- one fair key at a level with a ring); a priority list found emptied loses
-- its marker. weights: the claiming worker's fair_weights, or nil.
local function pop_pending(pending, want, weights)
  if redis.call('EXISTS', pending .. ':prio') == 0 then
    return redis.call('RPOP', pending, want)
  end
  local items = {}
  for _, l in ipairs(prio_levels(pending)) do
    if #items >= want then
      break
    end
    local plain = true
    if l.fair then
      plain = pop_fair(pending, l, want - #items, items, weights)
    end
    local ask = want - #items
    if plain and ask > 0 then
      local got = redis.call('RPOP', l.list, ask)
      local n = 0
      if got then
        n = #got
        for _, envelope in ipairs(got) do
          items[#items + 1] = envelope
        end
      end
      if n < ask and l.p ~= 0 then
        redis.call('ZREM', pending .. ':prio', tostring(l.p))
      end
    elseif not plain then
      break -- the ring stopped at its step bound: the claim goes on at this level next time
    end
  end
  if #items == 0 then
    return false
  end
  return items
end
