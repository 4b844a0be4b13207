-- A running job's fenced write (current_job().set_if_fresh), alone: the rule
-- is in _job_write.lua (SET only while the delivery is current).
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>   HASH token -> envelope
-- KEYS[2]  job fence   P:fence:{Q}:job:<jid>       raised past reaped or returned deliveries
-- KEYS[3]  target      the caller's key (on Cluster it must share the queue's hash tag)
-- ARGV[1]  token of the delivery
-- ARGV[2]  value to SET at the target
--
-- Reply: 1 when written.
-- Error: "FENCED ..." when the delivery is no longer current; nothing changes.
--!include _job_write.lua
local refused = fenced_job_write(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
if refused then
  return redis.error_reply(refused)
end
return 1
