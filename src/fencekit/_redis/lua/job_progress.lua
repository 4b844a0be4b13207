-- A running job's progress report: written into its record only while the
-- delivery is current (a stale delivery's progress never lands).
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>
-- KEYS[2]  record      P:{Q}:job:<jid>
-- ARGV[1]  token of the delivery
-- ARGV[2]  progress (JSON: fraction, message)
--
-- Reply: 1 when written, 0 when the task keeps no record.
-- Error: "FENCED ..." when the delivery is no longer in flight.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return redis.error_reply('FENCED delivery ' .. ARGV[1] .. ' is no longer in flight')
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
redis.call('HSET', KEYS[2], 'progress', ARGV[2])
return 1
