-- Release a waiting task whose parents are final: it joins its queue (its
-- priority's list) and its record says "pending". Only the call that takes it
-- out of the waiting hash releases it, so two dependency loops release it once.
--
-- KEYS[1]  waiting     P:{Q}:waiting
-- KEYS[2]  pending     P:{Q}:pending
-- KEYS[3]  wake        P:{Q}:wake
-- KEYS[4]  record      P:{Q}:job:<jid>
-- ARGV[1]  jid
-- ARGV[2]  the envelope to queue (with its parents' results)
--
-- Reply: 1 when released, 0 when it was not waiting (released or cancelled already).
--!include _wake.lua
--!include _prio.lua
--!include _env.lua
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
push_pending(KEYS[2], ARGV[2], false)
if redis.call('EXISTS', KEYS[4]) == 1 then
  write_env(KEYS[4], ARGV[2], { 'state', 'pending' })
end
wake(KEYS[3])
return 1
