-- A running job's fenced write (current_job().set_if_fresh): SET the target
-- only while this delivery is still the task's current one -- still in its
-- consumer's in-flight hash (not acknowledged, retried, failed, reaped or
-- returned) and not older than the job's fence, which exists only once a
-- delivery of the task was reaped or returned. Nothing is written for the
-- fence itself, so fenced jobs leave no key behind.
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>   HASH token -> envelope
-- KEYS[2]  job fence   P:fence:{Q}:job:<jid>       raised past reaped or returned deliveries
-- KEYS[3]  target      the caller's key (on Cluster it must share the queue's hash tag)
-- ARGV[1]  token of the delivery
-- ARGV[2]  value to SET at the target
--
-- Reply: 1 when written.
-- Error: "FENCED ..." when the delivery is no longer current; nothing changes.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return redis.error_reply('FENCED delivery ' .. ARGV[1] .. ' is no longer in flight')
end
local floor = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < floor then
  return redis.error_reply('FENCED delivery ' .. ARGV[1] .. ' is older than ' .. string.format('%d', floor))
end
redis.call('SET', KEYS[3], ARGV[2])
return 1
