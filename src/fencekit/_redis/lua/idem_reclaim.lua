-- Begin, or take over a "pending" key whose worker died: the whole decision
-- of IdempotencyGuard.try_begin_or_reclaim in one atomic step. The winner
-- also reserves the paired lock for itself ("0:<owner>", a grant with no
-- token yet), so a concurrent caller sees the lock held and backs off: at
-- most one caller begins or reclaims. The winner then acquires the lock with
-- the same owner id (lock_acquire.lua honours the reservation).
--
-- KEYS[1]  idempotency key  P:idem:{K}
-- KEYS[2]  result key       P:idem:{K}:result
-- KEYS[3]  lock key         P:lock:{R} of the lock that a live worker holds
--                           (on Cluster R must share K's hash tag, e.g. R = K)
-- ARGV[1]  owner id
-- ARGV[2]  TTL in seconds (>= 1)
-- ARGV[3]  reservation of the lock in milliseconds (>= 1)
--
-- Reply: "begun"       the key was absent; this owner begins
--        "reclaimed"   the key was pending and the lock free; this owner takes over
--        "done"        the work is done
--        "in_progress" the lock is held (a live worker, or a caller that just
--                      began or reclaimed), or the value is foreign
local value = redis.call('GET', KEYS[1])
if not value then
  redis.call('SET', KEYS[1], 'pending:' .. ARGV[1], 'EX', ARGV[2])
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[3], '0:' .. ARGV[1], 'PX', ARGV[3], 'NX')
  return 'begun'
end
if value == 'done' then
  return 'done'
end
if string.sub(value, 1, 8) == 'pending:' and redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('SET', KEYS[1], 'pending:' .. ARGV[1], 'EX', ARGV[2])
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[3], '0:' .. ARGV[1], 'PX', ARGV[3])
  return 'reclaimed'
end
return 'in_progress'
