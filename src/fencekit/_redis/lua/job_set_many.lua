-- The fenced writes of several running jobs of one consumer, made while one
-- was in flight (queue.batching): each is the rule of _job_write.lua, applied
-- in order, each refused or written on its own.
--
-- KEYS[1..]   three per write i = 1, 2, ...:
-- KEYS[3i-2]  inflight   P:{Q}:inflight:<consumer> of write i
-- KEYS[3i-1]  job fence  P:fence:{Q}:job:<jid> of write i
-- KEYS[3i]    target     the key write i sets
-- ARGV[1..]   two per write:
-- ARGV[2i-1]  token of the delivery making write i
-- ARGV[2i]    value of write i
--
-- Reply: an array with one element per write: 1 when written, or the error
-- "FENCED ..." when that delivery is no longer current (that write changed nothing).
--!include _job_write.lua
local out = {}
for i = 1, #ARGV / 2 do
  local refused = fenced_job_write(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[2 * i - 1], ARGV[2 * i])
  if refused then
    out[i] = {err = refused}
  else
    out[i] = 1
  end
end
return out
