-- Close a completing batch once its callbacks are enqueued: "done", its
-- finishing time, and its bookkeeping kept for keep_ms.
--
-- KEYS[1]  meta      P:{b:<bid>}:batch
-- KEYS[2]  children  P:{b:<bid>}:children
-- ARGV[1]  keep_ms: how long the finished batch stays readable (> 0)
--
-- Reply: 1 when this call closed it, 0 when it was not completing (closed
--        before, or not complete yet).
--!include _now_ms.lua
if redis.call('HGET', KEYS[1], 'state') ~= 'completing' then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'done', 'finished', now_ms())
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
