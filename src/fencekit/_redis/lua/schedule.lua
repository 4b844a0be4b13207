-- Move due scheduled tasks (retries, delayed tasks) into their queue,
-- earliest due first; and wake the queue's consumers when the token of an
-- operation whose tasks are parked for it is due (_flow.lua): a claim takes
-- them, even when the consumer that parked them, and would have looked
-- again, died.
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
local parked = string.sub(KEYS[2], 1, #KEYS[2] - #'pending') .. 'rparkedops'
if #redis.call('ZRANGEBYSCORE', parked, '-inf', now_ms(), 'LIMIT', 0, 1) > 0 then
  wake(KEYS[3])
end
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
