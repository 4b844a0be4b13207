-- Start a scheduled task now (the admin page's "run now"): move it from the
-- scheduled set to the head of its queue, and its record, if it has one,
-- says pending again.
--
-- KEYS[1]  scheduled   P:{Q}:scheduled
-- KEYS[2]  pending     P:{Q}:pending
-- KEYS[3]  wake        P:{Q}:wake
-- KEYS[4]  record      P:{Q}:job:<jid>
-- ARGV[1]  jid
--
-- Reply: 1 when moved, 0 when no scheduled task has that jid.
--!include _wake.lua
--!include _prio.lua
local needle = '{"jid":"' .. ARGV[1] .. '"'
for _, item in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(item, 1, #needle) == needle then
    redis.call('ZREM', KEYS[1], item)
    push_pending(KEYS[2], item, true)
    wake(KEYS[3])
    if redis.call('EXISTS', KEYS[4]) == 1 then
      redis.call('HSET', KEYS[4], 'state', 'pending')
      redis.call('HDEL', KEYS[4], 'due')
    end
    return 1
  end
end
return 0
