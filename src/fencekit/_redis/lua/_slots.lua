-- Concurrency keys (docs/guides/flow.md): a task's envelope may carry "ckey":<key>
-- right after its jid (and priority). The claim (ack_claim.lua with a spec,
-- _flow.lua) adds the delivery's token to the SET P:{Q}:slots:<key> while
-- fewer than the worker's max_concurrency are in it, else parks the task on
-- the LIST P:{Q}:parked:<key> (LPUSH in, RPOP out; the SET P:{Q}:parkedkeys
-- names the keys with parked tasks, for readers). Whatever ends a delivery
-- -- ack, retry, fail, drop, requeue (reaper, stop), cancel -- calls
-- release_slot: the token leaves the SET and, if it was there, the oldest
-- parked task of that key goes back to the head of its pending list.
-- Idempotent (SREM of a token), so a delivery released twice frees one slot.
-- Needs _prio.lua and _wake.lua.
local function ckey_of(envelope)
  return string.match(envelope, '^{"jid":"[^"]*","ckey":"([^"]*)"')
    or string.match(envelope, '^{"jid":"[^"]*","priority":%-?%d+,"ckey":"([^"]*)"')
end
-- "P:{Q}:" of any key of the queue (prefix and queue name hold no braces).
local function queue_base(key)
  return string.match(key, '^([^}]*}:)')
end
local function release_slot(base, envelope, token)
  local key = ckey_of(envelope)
  if not key then
    return
  end
  if redis.call('SREM', base .. 'slots:' .. key, token) == 1 then
    local parked = redis.call('RPOP', base .. 'parked:' .. key)
    if parked then
      push_pending(base .. 'pending', parked, true)
      wake(base .. 'wake')
    end
    if not parked or redis.call('EXISTS', base .. 'parked:' .. key) == 0 then
      redis.call('SREM', base .. 'parkedkeys', key)
    end
  end
end
