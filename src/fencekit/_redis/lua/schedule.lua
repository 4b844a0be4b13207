-- Move due scheduled tasks (retries, delayed tasks) into their queue,
-- earliest due first.
--
-- KEYS[1]  scheduled   P:{Q}:scheduled
-- KEYS[2]  pending     P:{Q}:pending
-- KEYS[3]  wake        P:{Q}:wake
-- ARGV[1]  the most tasks to move in this call
--
-- Reply: the number of tasks moved.
--!include _now_ms.lua
--!include _wake.lua
--!include _prio.lua
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))
if #due == 0 then
  return 0
end
redis.call('ZREM', KEYS[1], unpack(due))
for _, envelope in ipairs(due) do
  push_pending(KEYS[2], envelope, false)
end
wake(KEYS[3])
return #due
