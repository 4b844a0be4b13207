-- A running job's checkpoint (current_job().checkpoint): store its state while
-- the delivery is the task's current one (the rule of _job_write.lua: still in
-- its consumer's in-flight hash, not older than the job's fence), and mark the
-- in-flight envelope so the task's next delivery reads the state (_ckpt.lua).
-- A refused checkpoint changes nothing and counts "fenced_out".
--
-- KEYS[1]  inflight    P:{Q}:inflight:<consumer>   HASH token -> envelope
-- KEYS[2]  job fence   P:fence:{Q}:job:<jid>
-- KEYS[3]  state       P:{Q}:state:<jid>
-- KEYS[4]  stats       P:{Q}:stats                 ("fenced_out" += 1 when refused)
-- ARGV[1]  token of the delivery
-- ARGV[2]  the state (JSON)
-- ARGV[3]  how long the state lives without another checkpoint, in ms
-- KEYS[5], ARGV[4] (optional) the task's record P:{Q}:job:<jid> and its progress
--          (JSON), written there when the record exists (current_job().iterate)
--
-- Reply: 1 when stored.
-- Error: "FENCED ..." when the delivery is no longer current; nothing changes.
--!include _job_write.lua
--!include _ckpt.lua
local refused = fenced_job_write(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2])
if refused then
  redis.call('HINCRBY', KEYS[4], 'fenced_out', 1)
  return redis.error_reply(refused)
end
redis.call('PEXPIRE', KEYS[3], ARGV[3])
local envelope = redis.call('HGET', KEYS[1], ARGV[1])
if not marked(envelope) then
  redis.call('HSET', KEYS[1], ARGV[1], mark(envelope))
end
if KEYS[5] and redis.call('EXISTS', KEYS[5]) == 1 then
  redis.call('HSET', KEYS[5], 'progress', ARGV[4])
end
return 1
