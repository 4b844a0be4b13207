-- Register more children of an open batch (before they are enqueued).
--
-- KEYS[1]  meta      P:{b:<bid>}:batch
-- KEYS[2]  children  P:{b:<bid>}:children
-- ARGV[1]  the new children's queues, space-separated
-- ARGV[2..] the new children's jids (one already registered counts once)
--
-- Reply: how many were new.
-- Error: "NOBATCH ..." when the batch does not exist; "BATCHARMED ..." when
--        it is armed already (its callbacks may have fired: no child may join).
--!include _batch.lua
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return redis.error_reply('NOBATCH ' .. KEYS[1] .. ' does not exist')
end
if state ~= 'open' then
  return redis.error_reply('BATCHARMED ' .. KEYS[1] .. ' is ' .. state .. ': no child may join')
end
local added = 0
for i = 2, #ARGV do
  added = added + redis.call('HSETNX', KEYS[2], ARGV[i], '')
end
redis.call('HINCRBY', KEYS[1], 'total', added)
add_queues(KEYS[1], ARGV[1])
return added
