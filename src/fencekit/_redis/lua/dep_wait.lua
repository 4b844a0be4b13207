-- Hold a task until its parents are final (Task(depends_on=...): docs/design/batches.md,
-- "Dependencies"). The task waits in its queue's waiting hash, not in the queue; its
-- record says "waiting". The dependency loop (fencekit.services._deps) releases it
-- (dep_release.lua) once every parent succeeded, or cancels it (dep_cancel.lua).
--
-- KEYS[1]  waiting     P:{Q}:waiting     HASH jid -> JSON {env, parents, run}
-- KEYS[2]  stats       P:{Q}:stats       ("enqueued" += 1)
-- KEYS[3]  record      P:{Q}:job:<jid>
-- ARGV[1]  jid
-- ARGV[2]  the waiting entry (JSON: "env" the envelope as a string, "parents"
--          [[queue, jid], ...], "run" true to run even when a parent failed)
-- ARGV[3]  the envelope (for the record)
-- ARGV[4]  retention of the finished record in milliseconds
--
-- Reply: 1 when held; 0 when a task of that jid waits already (nothing changed).
--!include _now_ms.lua
--!include _env.lua
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('DEL', KEYS[3])
write_env(KEYS[3], ARGV[3], { 'state', 'waiting', 'enqueued', now_ms(), 'keep', ARGV[4] }, true)
redis.call('HINCRBY', KEYS[2], 'enqueued', 1)
return 1
