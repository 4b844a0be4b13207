-- Finish an in-flight delivery without running it: its task expired before it
-- started. It leaves the in-flight hash and is counted under ARGV[2] (for
-- example "expired"). As in fail.lua no fence is raised: the delivery never
-- ran, and once it has left the hash job_set.lua refuses its writes.
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>
-- KEYS[2]  stats       P:{Q}:stats
-- ARGV[1]  token of the delivery
-- ARGV[2]  the counter of the stats hash to raise
--
-- Reply: 1 when dropped.
-- Error: "FENCED ..." when the token is no longer this consumer's delivery;
--        counted as fenced_out, nothing else changes.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  redis.call('HINCRBY', KEYS[2], 'fenced_out', 1)
  return redis.error_reply('FENCED delivery ' .. ARGV[1] .. ' is no longer current')
end
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
return 1
